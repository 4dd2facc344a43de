"""RL on CPU (embedded backend): ms-swift GRPO with the qrewrite reward plugin, then merge the LoRA."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...config import base_model_swift
from ...envs import REPO, repo_pythonpath
from ...hardware import resolve_dtype
from ...reward.monitor import CURVE_ENV, FLUSH_EVERY_ENV, TB_DIR_ENV
from ...reward.adapter import CONFIG_ENV, PROJECT_ROOT_ENV
from .. import resume
from ..swift import commands, runner
from ..swift.merge import merge_lora

PLUGIN = REPO / "qrewrite" / "reward" / "swift_plugin.py"
REWARD_FUNC = "qrewrite_reward"


def grpo_hparams(cfg: dict, overrides: dict | None = None) -> dict:
    """The `swift rlhf` hyper-parameters: rl.swift_grpo (under `overrides`, the judge's), the device and the base
    model's swift type, with `precision` resolved for this machine as SFT's is (`sft.train.sft_hparams`), so stats and
    lineage say what ran."""
    hp, device = {**cfg["rl"]["swift_grpo"], **(overrides or {})}, cfg["train"]["device"]
    return {**hp, "device": device, "precision": resolve_dtype(hp.get("precision"), device), **base_model_swift(cfg)}


def run_swift_grpo(cfg: dict, *, config_path: str, model: str, train_jsonl: str, out: str, run_dir: str,
                   tb_dir: str, log_file: str | None = None, threads: int | None = None) -> dict:
    hp = grpo_hparams(cfg)
    shutil.rmtree(tb_dir, ignore_errors=True)
    cmd = {**hp, "model": model, "train_file": train_jsonl, "output_dir": run_dir, "logging_dir": tb_dir,
           "plugin": str(PLUGIN), "reward_funcs": [REWARD_FUNC],
           "num_layers": commands.model_num_layers(model) if hp.get("lora_layers") else None}
    argv = commands.grpo_cmd(cmd)
    # the config file carries the reward's settings, so it is an input of the run like the data
    fp = resume.fingerprint(argv, [model, train_jsonl, config_path, PLUGIN])
    ck = resume.last_complete_hf_checkpoint(run_dir) if resume.prepare_run_dir(run_dir, fp) else None
    if ck:
        argv = commands.grpo_cmd({**cmd, "resume_from_checkpoint": str(ck)})
    curve = resume.curve_for_run(run_dir, int(ck.name.split("-")[1]) if ck else 0)  # a resumed curve starts at 1
    env = {CONFIG_ENV: str(Path(config_path).resolve()), TB_DIR_ENV: str(Path(tb_dir).resolve()),
           CURVE_ENV: str(curve.resolve()), FLUSH_EVERY_ENV: "0", "PYTHONPATH": repo_pythonpath(),
           PROJECT_ROOT_ENV: os.getcwd()}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    wall = runner.run_swift(argv, log_file=log_file, env=env)
    resume.publish_curve(curve, tb_dir)
    ckpt = runner.last_checkpoint(run_dir)
    merged = merge_lora(cfg, base=model, adapter=str(ckpt), out=out, log_file=log_file)
    resume.mark_finished(run_dir)
    return {"backend": "swift-grpo", "wall_s": round(wall, 1), "merge_wall_s": merged["wall_s"],
            "resumed_from": ck.name if ck else None,
            "checkpoint": ckpt.name, "hparams": hp}
