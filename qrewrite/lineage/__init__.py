"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model.

What the file holds: `document`; writing it: `record`; checking it: `verify`; printing it: `show`; the
`qrewrite lineage` subcommand: `cli`. The names other packages use are importable from here.
"""


def __getattr__(name: str):
    # Loaded on first use, not at import: every `qrewrite` call registers the `lineage` subcommand, and
    # importing qrewrite.lineage.cli runs this file. Import statements, not importlib by name, so that
    # dvc.yaml's code deps (qrewrite/code_deps.py) still see what `from qrewrite.lineage import ...` runs.
    if name == "code_version":
        from .environment import code_version as value
    elif name == "verify_lineage":
        from .verify import verify_lineage as value
    elif name == "write_lineage":
        from .record import write_lineage as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return value
