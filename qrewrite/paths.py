"""The artifact layout, in one place: Snakemake rules, dvc.yaml and the CLI defaults all read it."""

from __future__ import annotations

RESULTS = "results"
STAGES = ("ingest", "teacher", "validate", "split")


def tenant_paths(tenant: str) -> dict[str, str]:
    r = f"{RESULTS}/{tenant}"
    return {
        "queries": f"{r}/queries.jsonl",
        "teacher": f"{r}/teacher.jsonl",
        "validated": f"{r}/validated.jsonl",
        "sft_dir": f"{r}/sft",
        "train": f"{r}/sft/train.jsonl",
        "val": f"{r}/sft/val.jsonl",
        "test": f"{r}/sft/test.jsonl",
        "summary": f"{r}/summary.json",
        **{f"stats_{s}": f"{r}/stats/{s}.json" for s in STAGES},
    }
