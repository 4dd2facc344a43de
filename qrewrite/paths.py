"""The artifact layout, in one place: artifact key → path. The stage table (qrewrite/workflow/stages.py) says
which stage makes each artifact from which; the Snakemake rules, dvc.yaml and lineage read both."""

from __future__ import annotations

RESULTS = "results"
MODELS = "models"
LOGS = "logs"
STAGES = ("ingest", "teacher", "validate", "split")

BASE_MODEL = f"{MODELS}/base"


def demo_excel(tenant: str) -> str:
    """Where rule build_excel writes a demo tenant's raw Excel (its tenants[].raw_excel must say so)."""
    return f"data/raw/{tenant}.xlsx"


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
        "sft_train": f"{r}/sft/targets/train.jsonl",  # what SFT learns from (train.sft.targets)
        "sft_val": f"{r}/sft/targets/val.jsonl",
        "stats_sft_targets": f"{r}/stats/sft_targets.json",
        "gate": f"{r}/gate.json",                   # the training gate: may a student be trained on this data
        "reward_check": f"{r}/reward_check.json",   # the judge and the reward checked on derived labels
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
        "rl_val_rewrites": f"{r}/train/rl-val-rewrites.json",  # both models' rewrites of val (qrewrite.eval.reuse)
        # preference optimisation (pref.enabled): pairs from the training rows, DPO on the merged SFT model
        "pref_pairs": f"{r}/pref/pairs.jsonl",   # ms-swift DPO rows: SFT prompt + chosen, rejected_response
        "pref_examples": f"{r}/pref/examples.jsonl",  # ms-swift KTO rows: SFT prompt + one text, label
        "pref_pairs_summary": f"{r}/pref/summary.json",  # rows, pairs, examples, why rows gave no pair
        "pref_run": f"{r}/train/pref-run",       # swift's output_dir
        "pref_model": f"{m}/pref",               # LoRA adapter (last checkpoint) over sft-merged
        "pref_merged": f"{m}/pref-merged",       # sft-merged + the DPO adapter, full HF folder
        "stats_pref": f"{r}/stats/pref.json",
        "tb_pref": f"{LOGS}/tensorboard/{tenant}/pref",
        "release": f"{m}/release",               # what the tenant gets, chosen on validation: a model or a rule
        "stats_sft": f"{r}/stats/sft.json",
        "stats_rl": f"{r}/stats/rl.json",
        "tb_sft": f"{LOGS}/tensorboard/{tenant}/sft",
        "tb_rl": f"{LOGS}/tensorboard/{tenant}/rl",
        # the distilled judge (`snakemake judge`)
        "judge_items": f"{r}/judge/items.jsonl",
        "judge_sft_train": f"{r}/judge/sft_train.jsonl",
        "judge_sft_val": f"{r}/judge/sft_val.jsonl",
        "judge_grpo_train": f"{r}/judge/grpo_train.jsonl",
        "judge_student_test": f"{r}/judge/student_test.jsonl",
        "judge_sft_model": f"{m}/judge-sft",           # LoRA adapter
        "judge_sft_merged": f"{m}/judge-sft-merged",
        "judge_model": f"{m}/judge",                   # after GRPO: reward.judge.model.path
        "judge_sft_run": f"{r}/train/judge-sft-run",
        "judge_grpo_run": f"{r}/train/judge-grpo-run",
        "stats_judge_data": f"{r}/stats/judge_data.json",
        "stats_judge_sft": f"{r}/stats/judge_sft.json",
        "stats_judge_grpo": f"{r}/stats/judge_grpo.json",
        "tb_judge_sft": f"{LOGS}/tensorboard/{tenant}/judge-sft",
        "tb_judge_grpo": f"{LOGS}/tensorboard/{tenant}/judge-grpo",
    }


# --- files a tenant's config names, and the base model's key -----------------------------------------------
BASE_MODEL_KEY = "base_model"
CONFIG_FILES = ("raw_excel", "kb", "demo_source", "judge_labels", "gold_set", "red_team")  # tenants[].raw_excel, .kb.path, …
# Config-given files a tenant may leave out (null): a stage's other inputs still make its outputs without them.
OPTIONAL_FILES = ("judge_labels", "gold_set", "red_team")


def artifact_paths(tenant: dict) -> dict[str, str]:
    """Every artifact key of tenant config `tenant` → its path (tenant_paths + base model + config files)."""
    out = {**tenant_paths(tenant["name"]), BASE_MODEL_KEY: BASE_MODEL,
           "raw_excel": tenant["raw_excel"], "kb": tenant["kb"]["path"]}
    for key in ("demo_source", *OPTIONAL_FILES):
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
        "judge_json": f"{REPORTS}/{tenant}/judge.json",             # the distilled judge measured (`snakemake judge`)
    }


def deploy_json(tenant: str) -> str:
    """The serving check's report (`qrewrite deploy-check`): not an input of any other stage."""
    return f"{REPORTS}/{tenant}/deploy.json"
