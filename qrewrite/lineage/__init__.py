"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model.

What the file holds: `document`; writing it: `record`; checking it: `verify`; printing it: `show`; the
`qrewrite lineage` subcommand: `cli`. Importers name the module (`from qrewrite.lineage.record import
write_lineage`): every `qrewrite` call imports `lineage.cli` to register its subcommand, which runs this
file, so it stays empty and no stage's code deps include lineage code it does not run.
"""
