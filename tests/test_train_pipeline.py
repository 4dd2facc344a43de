"""The training half through Snakemake on CPU, as `make run` runs it, on a tiny config: real ms-swift
(`swift sft` LoRA → `swift export --merge_lora` → `swift rlhf --rlhf_type grpo` with the qrewrite reward
plugin → merge), one tenant, 80 queries, 2 SFT steps and 1 GRPO step. About 4 minutes on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from qrewrite.paths import BASE_MODEL, tenant_paths
from test_reward_frameworks import train_python

TB_TAGS = """
import json, sys
from tensorboard.backend.event_processing import event_accumulator
out = {}
for d in sys.argv[1:]:
    ea = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    out[d] = {t: [e.value for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
print(json.dumps(out))
"""

TINY = {
    "train": {"device": "cpu", "threads": 2, "sft": {"max_steps": 2, "per_device_train_batch_size": 4,
                                                      "per_device_eval_batch_size": 8, "gradient_accumulation_steps": 1,
                                                      "max_length": 512, "eval_steps": 1, "save_steps": 1,
                                                      "logging_steps": 1, "learning_rate": 2.0e-4}},
    "rl": {"backend": "swift-grpo", "swift_grpo": {"max_steps": 1, "per_device_train_batch_size": 4,
                                                   "num_generations": 2, "max_completion_length": 16,
                                                   "max_length": 512, "save_steps": 1}},
}


def snakemake(project, *args):
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile",
                           str(project.config_path), "--cores", "2", *args], capture_output=True, text=True, env=env,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import Project

    train_python("swift")  # fails (not skips) in CI when the env is missing
    project = Project(tmp_path_factory.mktemp("train") / "proj")
    cfg = project.config
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == "fivedoctors"]
    cfg.update(TINY)
    project.set_config(cfg)
    project.keep_queries("fivedoctors", 80)
    snakemake(project, "models")
    return project


@pytest.mark.slow
def test_models_are_made_for_the_tenant(trained):
    root, p = trained.root, tenant_paths("fivedoctors")
    base = root / BASE_MODEL
    assert (base / "config.json").is_file() and (base / "model.safetensors").is_file()
    assert "im_start" in json.loads((base / "tokenizer_config.json").read_text()).get("chat_template", "") or \
        (base / "chat_template.jinja").is_file()
    assert (root / p["sft_model"] / "adapter_config.json").is_file()
    assert (root / p["sft_model"] / "adapter_model.safetensors").is_file()
    for key in ("sft_merged", "rl_model"):
        m = root / p[key]
        assert (m / "config.json").is_file() and list(m.glob("*.safetensors")), key
    sft = json.loads((root / p["stats_sft"]).read_text())
    assert sft["best_eval_loss"] is not None and sft["steps"] == 2
    assert sft["best_checkpoint"] in {"checkpoint-1", "checkpoint-2"}
    assert sft["hparams"]["lora_rank"] == 16 and sft["hparams"]["lora_alpha"] == 32  # the design's, from the schema
    rl = json.loads((root / p["stats_rl"]).read_text())
    assert rl["backend"] == "swift-grpo" and rl["reward"]["rollouts_scored"] == 4
    assert -1.0 <= rl["reward"]["last"]["reward_mean"] <= 1.0
    assert rl["reward"]["rag_calls"] + rl["reward"]["rag_cache_hit_rate"] > 0
    # no temp folders left next to the models
    assert not [x for x in (root / "models").rglob(".*") if x.name.endswith(".tmp")]


@pytest.mark.slow
def test_tensorboard_logs_hold_losses_and_reward_components(trained):
    py = train_python("swift")
    p = tenant_paths("fivedoctors")
    dirs = [str(trained.root / p["tb_sft"]), str(trained.root / p["tb_rl"])]
    proc = subprocess.run([str(py), "-c", TB_TAGS, *dirs], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = json.loads(proc.stdout.strip().splitlines()[-1])
    sft, rl = tags[dirs[0]], tags[dirs[1]]
    assert "train/loss" in sft and "eval/loss" in sft, sorted(sft)
    for tag in ("reward_mean", "judge_term", "retrieval_term", "win_term", "win_rate", "student_top1",
                "teacher_top1", "rag_calls", "judge_calls", "rag_cache_hit_rate", "judge_cache_hit_rate"):
        assert f"qrewrite/{tag}" in rl, tag
    assert "train/loss" in rl and "train/reward" in rl, sorted(rl)
    # the monitor's mean reward is the mean ms-swift logged for the same step
    assert rl["qrewrite/reward_mean"][0] == pytest.approx(rl["train/reward"][0], abs=1e-4)


@pytest.mark.slow
def test_rerun_is_a_no_op(trained):
    dry = snakemake(trained, "-n", "models")
    assert "Nothing to be done" in dry.stdout + dry.stderr
