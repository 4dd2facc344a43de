"""The artifact layout, in one place: Snakemake rules, dvc.yaml and the CLI defaults all read it."""

from __future__ import annotations

RESULTS = "results"
MODELS = "models"
LOGS = "logs"
STAGES = ("ingest", "teacher", "validate", "split")

BASE_MODEL = f"{MODELS}/base"


def tenant_paths(tenant: str) -> dict[str, str]:
    r = f"{RESULTS}/{tenant}"
    m = f"{MODELS}/{tenant}"
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
        # training
        "sft_model": f"{m}/sft",                 # LoRA adapter (best checkpoint by val loss)
        "sft_merged": f"{m}/sft-merged",         # base + adapter, full HF folder
        "sft_run": f"{r}/train/sft-run",         # swift's output_dir (checkpoints, logging.jsonl)
        "rl_dir": f"{r}/rl",
        "rl_train": f"{r}/rl/train.parquet",     # verl layout
        "rl_val": f"{r}/rl/val.parquet",
        "rl_train_swift": f"{r}/rl/train.swift.jsonl",  # same rows, ms-swift GRPO layout
        "rl_val_swift": f"{r}/rl/val.swift.jsonl",
        "rl_run": f"{r}/train/rl-run",           # backend's checkpoints
        "rl_model": f"{m}/rl",                   # merged HF model of the final RL checkpoint
        "stats_sft": f"{r}/stats/sft.json",
        "stats_rl": f"{r}/stats/rl.json",
        "tb_sft": f"{LOGS}/tensorboard/{tenant}/sft",
        "tb_rl": f"{LOGS}/tensorboard/{tenant}/rl",
    }
