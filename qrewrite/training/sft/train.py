"""LoRA SFT with ms-swift: run `swift sft`, keep the best checkpoint by validation loss as the adapter."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from ...config import base_model_swift
from ...errors import QrewriteError
from ...hardware import processes_per_node, resolve_dtype
from ...io_utils import atomic_dir, read_jsonl
from .. import resume
from ..swift import commands, runner

# What a LoRA adapter folder needs (args.json lets `swift export/infer` read the template settings).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "args.json", "trainer_state.json")


# Keys of train.sft that shape the schedule; `schedule` turns them into swift's step counts.
SCHEDULE_KEYS = ("evals_per_epoch", "early_stop_evals", "max_wall_minutes")


def save_adapter(checkpoint: Path, out: str, which: str) -> None:
    """The LoRA adapter of a swift checkpoint copied whole into `out` (atomic); raises when its config or weights
    are missing. `which` names the checkpoint in the error (best, last)."""
    missing = [f for f in ADAPTER_FILES[:2] if not (checkpoint / f).is_file()]
    if missing:
        raise QrewriteError(f"{which} checkpoint {checkpoint} lacks {missing}", hint="was --tuner_type lora used?")
    with atomic_dir(out) as tmp:
        for f in ADAPTER_FILES:
            if (checkpoint / f).is_file():
                shutil.copy2(checkpoint / f, tmp / f)


def sft_hparams(cfg: dict) -> dict:
    """The `swift sft` hyper-parameters for this config: train.sft + device + the base model's swift type, with
    train.sft.precision resolved for this machine (auto: bfloat16 where it is native, float32 where it would be
    emulated), so stats and lineage say what ran."""
    sft, device = cfg["train"]["sft"], cfg["train"]["device"]
    return {**sft, "device": device, "precision": resolve_dtype(sft.get("precision"), device), **base_model_swift(cfg)}


def schedule(hp: dict, n_train: int, world_size: int = 1) -> dict:
    """The step counts of an SFT run on `n_train` rows: the epochs decide, not a step count tuned to one tenant.

    One epoch is ceil(rows / (batch x accumulation x processes)) optimizer steps; validation loss is measured and a
    checkpoint saved `evals_per_epoch` times an epoch, and the run is rounded up to end on an evaluation (at most
    one step per evaluation more), so no trained step goes unevaluated. `max_steps` (smoke tests) caps it."""
    per_step = hp["per_device_train_batch_size"] * hp["gradient_accumulation_steps"] * world_size
    steps_per_epoch = max(1, math.ceil(n_train / per_step))
    planned = max(1, math.ceil(hp["num_train_epochs"] * steps_per_epoch))
    if hp.get("max_steps"):
        planned = min(planned, int(hp["max_steps"]))
    evals = max(1, min(planned, round(planned / steps_per_epoch * hp["evals_per_epoch"])))
    every = math.ceil(planned / evals)
    planned = math.ceil(planned / every) * every
    return {"train_rows": n_train, "steps_per_epoch": steps_per_epoch, "planned_steps": planned,
            "epochs": round(planned / steps_per_epoch, 3), "eval_steps": every, "world_size": world_size}


def eval_history(run_dir: str | Path) -> dict:
    """Losses from swift's logging.jsonl: train loss per logging step, eval loss per eval step."""
    train, evals = [], []
    for rec in runner.read_log_history(run_dir):
        step = rec.get("global_step/max_steps", "")
        step = int(str(step).split("/")[0]) if step else None
        if "eval_loss" in rec:
            evals.append({"step": step, "eval_loss": float(rec["eval_loss"])})
        elif "loss" in rec:
            train.append({"step": step, "loss": float(rec["loss"])})
    return {"train": train, "eval": evals}


def swift_sft_args(hp: dict, *, base: str, train: str, val: str, run_dir: str, tb_dir: str, steps: int,
                   eval_steps: int, early_stop: int | None) -> dict:
    """`commands.sft_cmd`'s dict for these hyper-parameters (`sft_hparams`) and this schedule: a checkpoint at every
    evaluation. The pipeline builds its commands here (and the pinned study studies/2026-12-05-sft-bf16-autocast did)."""
    return {**{k: v for k, v in hp.items() if k not in SCHEDULE_KEYS}, "model": base, "train_file": train,
            "val_file": val, "output_dir": run_dir, "logging_dir": tb_dir,
            "num_layers": commands.model_num_layers(base) if hp.get("lora_layers") else None,
            "max_steps": steps, "eval_steps": eval_steps, "save_steps": eval_steps, "early_stop_interval": early_stop}


def run_sft(cfg: dict, *, base: str, train: str, val: str, out: str, run_dir: str, tb_dir: str,
            log_file: str | None = None, threads: int | None = None) -> dict:
    """Train (or resume an interrupted run of the same command), then copy the best checkpoint's adapter
    to `out` (atomically). Returns stats."""
    hp = sft_hparams(cfg)
    shutil.rmtree(tb_dir, ignore_errors=True)  # a Snakemake output: it deletes it before a rerun anyway
    # torchrun's process count on a multi-GPU node (swift reads NPROC_PER_NODE): the GPUs the job was given; the
    # global batch grows with it
    nproc = processes_per_node(cfg["train"]["device"])
    plan = schedule(hp, len(read_jsonl(train)), nproc)
    cmd = swift_sft_args(hp, base=base, train=train, val=val, run_dir=run_dir, tb_dir=tb_dir,
                         steps=plan["planned_steps"], eval_steps=plan["eval_steps"], early_stop=hp.get("early_stop_evals"))
    argv = commands.sft_cmd(cmd)
    # a different command or input wipes run_dir; the same one, killed, resumes from its last complete checkpoint
    ck = (resume.last_complete_hf_checkpoint(run_dir)
          if resume.prepare_run_dir(run_dir, resume.fingerprint(argv, [base, train, val])) else None)
    if ck:
        argv = commands.sft_cmd({**cmd, "resume_from_checkpoint": str(ck)})
    env = {**({"OMP_NUM_THREADS": str(threads)} if threads else {}),
           **({"NPROC_PER_NODE": str(nproc)} if nproc > 1 else {})} or None
    cap = hp.get("max_wall_minutes")
    if cap:
        wall, capped = runner.run_swift(argv, log_file=log_file, env=env, max_wall_s=cap * 60)
    else:
        wall, capped = runner.run_swift(argv, log_file=log_file, env=env), False
    if capped and not runner.has_checkpoint(run_dir):
        raise QrewriteError(f"train.sft.max_wall_minutes ({cap}) stopped SFT before its first checkpoint "
                            f"(every {plan['eval_steps']} steps)", hint="raise train.sft.max_wall_minutes, or "
                            "evaluate more often (train.sft.evals_per_epoch)")
    best = runner.best_checkpoint(run_dir)
    save_adapter(best, out, "best")
    if not capped:  # a capped run is not finished: a rerun resumes it from its last checkpoint
        resume.mark_finished(run_dir)
    hist = eval_history(run_dir)
    best_eval = min((e["eval_loss"] for e in hist["eval"]), default=None)
    if not runner.event_files(tb_dir):
        raise QrewriteError(f"swift wrote no TensorBoard events under {tb_dir}")
    return {"wall_s": round(wall, 1), "resumed_from": ck.name if ck else None,
            "best_checkpoint": best.name, "best_eval_loss": best_eval,
            "first_eval_loss": hist["eval"][0]["eval_loss"] if hist["eval"] else None,
            "final_train_loss": hist["train"][-1]["loss"] if hist["train"] else None,
            "steps": (steps := max((e["step"] or 0 for e in hist["train"] + hist["eval"]), default=0)),
            "schedule": plan, "stopped": "wall-clock cap" if capped else
            ("early stop" if steps < plan["planned_steps"] else "epochs done"),
            "history": hist, "hparams": hp}
