"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model."""

from .record import code_version, verify_lineage, write_lineage

__all__ = ["code_version", "verify_lineage", "write_lineage"]
