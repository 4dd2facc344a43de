"""The judge's two training stages with the project's own machinery: LoRA SFT on reason + score
(``training.sft.train.run_sft``: epochs, validation loss, early stop, resume) from the base model, then GRPO from the
merged SFT judge with the format and verdict rewards (``swift rlhf``, the rewrite GRPO's command builder and
resume), each merged into a plain model folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..envs import REPO, repo_pythonpath
from ..training import resume
from ..training.swift import commands, runner
from ..training.swift.merge import merge_lora
from ..training.sft.train import run_sft

PLUGIN = REPO / "qrewrite" / "judge" / "swift_rewards.py"
REWARD_FUNCS = ["judge_format", "judge_verdict"]


def sft_config(cfg: dict) -> dict:
    """cfg with train.sft replaced by the judge's: train.sft under judge.sft's overrides."""
    return {**cfg, "train": {**cfg["train"], "sft": {**cfg["train"]["sft"], **cfg["judge"]["sft"]}}}


def grpo_hparams(cfg: dict) -> dict:
    """rl.swift_grpo under judge.grpo's overrides, resolved as the student's GRPO is."""
    from ..training.rl.swift_grpo import grpo_hparams as student_grpo

    return student_grpo(cfg, cfg["judge"]["grpo"])


def run_judge_sft(cfg: dict, *, base: str, train: str, val: str, adapter: str, merged: str, run_dir: str,
                  tb_dir: str, log_file: str | None = None, threads: int | None = None) -> dict:
    jcfg = sft_config(cfg)
    stats = run_sft(jcfg, base=base, train=train, val=val, out=adapter, run_dir=run_dir, tb_dir=tb_dir,
                    log_file=log_file, threads=threads)
    stats["merge"] = merge_lora(jcfg, base=base, adapter=adapter, out=merged, log_file=log_file)
    return stats


def run_judge_grpo(cfg: dict, *, model: str, train_jsonl: str, out: str, run_dir: str, tb_dir: str,
                   log_file: str | None = None, threads: int | None = None) -> dict:
    hp = grpo_hparams(cfg)
    shutil.rmtree(tb_dir, ignore_errors=True)
    cmd = {**hp, "model": model, "train_file": train_jsonl, "output_dir": run_dir, "logging_dir": tb_dir,
           "plugin": str(PLUGIN), "reward_funcs": REWARD_FUNCS,
           "num_layers": commands.model_num_layers(model) if hp.get("lora_layers") else None}
    argv = commands.grpo_cmd(cmd)
    fp = resume.fingerprint(argv, [model, train_jsonl, PLUGIN])
    ck = resume.last_complete_hf_checkpoint(run_dir) if resume.prepare_run_dir(run_dir, fp) else None
    if ck:
        argv = commands.grpo_cmd({**cmd, "resume_from_checkpoint": str(ck)})
    env = {"PYTHONPATH": repo_pythonpath()}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    wall = runner.run_swift(argv, log_file=log_file, env=env)
    ckpt = runner.last_checkpoint(run_dir)
    merged = merge_lora(cfg, base=model, adapter=str(ckpt), out=out, log_file=log_file)
    resume.mark_finished(run_dir)
    curve = [{k: r.get(k) for k in ("rewards/JudgeFormat/mean", "rewards/JudgeVerdict/mean", "reward")}
             for r in runner.read_log_history(run_dir) if "reward" in r]
    return {"wall_s": round(wall, 1), "merge_wall_s": merged["wall_s"], "resumed_from": ck.name if ck else None,
            "checkpoint": ckpt.name, "hparams": hp, "curve": curve, "run_dir": str(Path(run_dir))}
