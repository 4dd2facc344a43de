"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model.

What the file holds: `document`; writing it: `record`; checking it: `verify`; printing it: `show`; the
`qrewrite lineage` subcommand: `cli`. Re-exported here: the names other packages use.
"""

from .environment import code_version
from .record import write_lineage
from .verify import verify_lineage

__all__ = ["code_version", "verify_lineage", "write_lineage"]
