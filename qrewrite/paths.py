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
        "data_card": f"{r}/data_card.md",            # the dataset's card (qrewrite data-card)
        "data_card_json": f"{r}/data_card.json",
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


# --- provenance: which rule makes each artifact, from which artifacts --------------------------------------
# Keys are tenant_paths keys, plus BASE_MODEL_KEY and the tenant's config-given files in CONFIG_INPUTS.
# `qrewrite lineage` walks this back to the raw Excel; tests/test_lineage.py fails when it drifts from the
# Snakemake rules (same rule names, same inputs).
BASE_MODEL_KEY = "base_model"
CONFIG_INPUTS = ("raw_excel", "kb", "demo_source", "gold_set", "red_team")  # tenants[].raw_excel, .kb.path, …
# Config-given files a tenant may leave out (null): a rule's other inputs still make its outputs without them.
OPTIONAL_INPUTS = ("gold_set", "red_team")
UPSTREAM: dict[str, tuple[str, tuple[str, ...]]] = {
    "raw_excel": ("build_excel", ("demo_source",)),  # demo tenants only; otherwise supplied (and `dvc add`ed)
    **{k: ("ingest", ("raw_excel", "kb")) for k in ("queries", "stats_ingest")},
    **{k: ("teacher", ("queries", "kb")) for k in ("teacher", "stats_teacher")},
    **{k: ("validate", ("queries", "teacher", "kb")) for k in ("validated", "stats_validate")},
    **{k: ("split", ("queries", "teacher", "validated", "gold_set")) for k in ("train", "val", "test", "stats_split")},
    "summary": ("summarize", tuple(f"stats_{s}" for s in STAGES)),
    **{k: ("data_card", ("raw_excel", "kb", "gold_set", "red_team", "queries", "teacher", "validated", "train",
                         "val", "test", "summary")) for k in ("data_card", "data_card_json")},
    **{k: ("rl_data", ("train", "val", "queries", "red_team"))
       for k in ("rl_train", "rl_val", "rl_train_swift", "rl_val_swift")},
    BASE_MODEL_KEY: ("base_model", ()),
    # the data card is an input of SFT so every model's lineage lists the card of the data it learnt from
    **{k: ("sft", (BASE_MODEL_KEY, "train", "val", "data_card_json")) for k in ("sft_model", "tb_sft", "stats_sft")},
    "sft_merged": ("merge_sft", (BASE_MODEL_KEY, "sft_model")),
    **{k: ("rl", ("sft_merged", "rl_train", "rl_val", "rl_train_swift", "kb")) for k in ("rl_model", "tb_rl", "stats_rl")},
}


def artifact_paths(tenant: dict) -> dict[str, str]:
    """Every artifact key of tenant config `tenant` → its path (tenant_paths + base model + config files)."""
    out = {**tenant_paths(tenant["name"]), BASE_MODEL_KEY: BASE_MODEL,
           "raw_excel": tenant["raw_excel"], "kb": tenant["kb"]["path"]}
    for key in ("demo_source", "gold_set", "red_team"):
        if tenant.get(key):
            out[key] = tenant[key]
    return out


# --- evaluation and reports --------------------------------------------------------------------------------
REPORTS = "reports"
REPORT_HTML = f"{REPORTS}/index.html"


def eval_paths(tenant: str) -> dict[str, str]:
    """Per-tenant eval artifacts; `rewrites` is a pattern with {candidate}."""
    return {
        "rewrites": f"{RESULTS}/{tenant}/eval/{{candidate}}.jsonl",  # one candidate's rewrites + latencies
        "eval_json": f"{REPORTS}/{tenant}/eval.json",              # metrics (DVC metrics)
        "examples": f"{REPORTS}/{tenant}/examples.jsonl",           # biggest wins and losses vs the baseline
        "plots": f"{REPORTS}/{tenant}/plots.json",                  # per-candidate bars (DVC plots)
    }


def deploy_json(tenant: str) -> str:
    """The serving check's report (`qrewrite deploy-check`): not an input of any other stage."""
    return f"{REPORTS}/{tenant}/deploy.json"
