"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model.

What the file holds: `document`; checking it: `verify`; printing it: `show`; the `qrewrite lineage` subcommand:
`cli`. Writing it walks the stage table, so it stands above it: qrewrite/workflow/record.py (and upstream.py, the
walk), which the stages that make a model call. Importers name the module (`from qrewrite.lineage.verify import
verify_lineage`): every `qrewrite` call imports `lineage.cli` to register its subcommand, which runs this
file, so it stays empty and no stage's code deps include lineage code it does not run.
"""
