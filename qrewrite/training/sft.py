"""LoRA SFT with ms-swift: run `swift sft`, keep the best checkpoint by validation loss as the adapter."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..config import base_model_swift
from ..errors import QrewriteError
from ..io_utils import atomic_dir
from . import resume
from . import swift_cmds as sc

# What a LoRA adapter folder needs (args.json lets `swift export/infer` read the template settings).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "args.json", "trainer_state.json")


def sft_hparams(cfg: dict) -> dict:
    """The `swift sft` hyper-parameters for this config: train.sft + device + the base model's swift type."""
    return {**cfg["train"]["sft"], "device": cfg["train"]["device"], **base_model_swift(cfg)}


def eval_history(run_dir: str | Path) -> dict:
    """Losses from swift's logging.jsonl: train loss per logging step, eval loss per eval step."""
    train, evals = [], []
    for rec in sc.read_log_history(run_dir):
        step = rec.get("global_step/max_steps", "")
        step = int(str(step).split("/")[0]) if step else None
        if "eval_loss" in rec:
            evals.append({"step": step, "eval_loss": float(rec["eval_loss"])})
        elif "loss" in rec:
            train.append({"step": step, "loss": float(rec["loss"])})
    return {"train": train, "eval": evals}


def run_sft(cfg: dict, *, base: str, train: str, val: str, out: str, run_dir: str, tb_dir: str,
            log_file: str | None = None, threads: int | None = None) -> dict:
    """Train (or resume an interrupted run of the same command), then copy the best checkpoint's adapter
    to `out` (atomically). Returns stats."""
    hp = sft_hparams(cfg)
    shutil.rmtree(tb_dir, ignore_errors=True)  # a Snakemake output: it deletes it before a rerun anyway
    cmd = {**hp, "model": base, "train_file": train, "val_file": val, "output_dir": run_dir, "logging_dir": tb_dir,
           "num_layers": sc.model_num_layers(base) if hp.get("lora_layers") else None}
    argv = sc.sft_cmd(cmd)
    # a different command or input wipes run_dir; the same one, killed, resumes from its last complete checkpoint
    ck = (resume.last_complete_hf_checkpoint(run_dir)
          if resume.prepare_run_dir(run_dir, resume.fingerprint(argv, [base, train, val])) else None)
    if ck:
        argv = sc.sft_cmd({**cmd, "resume_from_checkpoint": str(ck)})
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None
    wall = sc.run_swift(argv, log_file=log_file, env=env)
    best = sc.best_checkpoint(run_dir)
    missing = [f for f in ADAPTER_FILES[:2] if not (best / f).is_file()]
    if missing:
        raise QrewriteError(f"best checkpoint {best} lacks {missing}", hint="was --tuner_type lora used?")
    with atomic_dir(out) as tmp:
        for f in ADAPTER_FILES:
            if (best / f).is_file():
                shutil.copy2(best / f, tmp / f)
    resume.mark_finished(run_dir)
    hist = eval_history(run_dir)
    best_eval = min((e["eval_loss"] for e in hist["eval"]), default=None)
    if not sc.event_files(tb_dir):
        raise QrewriteError(f"swift wrote no TensorBoard events under {tb_dir}")
    return {"wall_s": round(wall, 1), "resumed_from": ck.name if ck else None,
            "best_checkpoint": best.name, "best_eval_loss": best_eval,
            "first_eval_loss": hist["eval"][0]["eval_loss"] if hist["eval"] else None,
            "final_train_loss": hist["train"][-1]["loss"] if hist["train"] else None,
            "steps": max((e["step"] or 0 for e in hist["train"] + hist["eval"]), default=0),
            "history": hist, "hparams": hp}
