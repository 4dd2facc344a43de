"""DPO of the rewrite student with ms-swift (the pref stage): `swift rlhf --rlhf_type dpo` with LoRA on the merged SFT
model, then the adapter merged into it.

The reference model is the merged SFT model itself: with LoRA, ms-swift (trl) computes the reference log-probabilities
with the adapter switched off, so no second model is loaded (`--ref_model` is refused with LoRA). The pairs
(`pairs.py`) carry the SFT prompt as `messages` with the chosen rewrite as the assistant turn and the rejected one as
`rejected_response`: ms-swift's DPO row, rendered with the SFT template. `rpo_alpha` adds the SFT loss on the chosen
text (RPO), so the student keeps writing what SFT taught while it learns the preference.

Too few pairs stop the stage (`check_pairs`): DPO on a handful of pairs moves the model by noise, and a copy of the
SFT model under another name would be a candidate that is not what its name says. The stage's error names the
counts and what to set (more samples, a higher temperature, a lower pref.min_pairs, or pref.enabled: false).

There is no validation loss: the pairs are training rows only, and which model the tenant gets is the release's
choice on the validation split (qrewrite.release). The last checkpoint is the model; a killed run resumes from its
last complete checkpoint, as SFT does (qrewrite.training.resume).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from ...config import base_model_swift
from ...errors import QrewriteError
from ...hardware import resolve_dtype
from ...io_utils import read_json, read_jsonl
from .. import resume
from ..sft.train import save_adapter
from ..swift import commands as sc
from ..swift import runner
from ..swift.merge import merge_lora

# pref's keys that are not swift's hyper-parameters (sampling, the floor, the switch)
NOT_SWIFT = ("enabled", "samples", "temperature", "top_p", "max_new_tokens", "sample_batch_size", "min_pairs")

DPO_DEFAULTS: dict[str, Any] = {
    **{k: sc.SFT_DEFAULTS[k] for k in ("model_type", "template", "device", "precision", "lora_rank", "lora_alpha",
                                       "lora_dropout", "target_modules", "lora_layers", "num_layers",
                                       "gradient_checkpointing", "max_steps", "per_device_train_batch_size",
                                       "gradient_accumulation_steps", "max_length", "seed",
                                       "dataloader_num_workers", "dataset_num_proc")},
    "learning_rate": 5e-6,
    "num_train_epochs": 1,
    "warmup_ratio": 0.1,
    "beta": 0.1,
    "rpo_alpha": 1.0,
    "loss_type": "sigmoid",
    "save_steps": 5,
    "save_total_limit": 2,
    "logging_steps": 1,
}


def dpo_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift rlhf --rlhf_type dpo`` with LoRA on a local pairs jsonl (rows: ``messages`` ending in the chosen
    assistant turn, ``rejected_response``). Required: model, train_file, output_dir. Optional: logging_dir,
    resume_from_checkpoint, everything in DPO_DEFAULTS (rpo_alpha None: no SFT term)."""
    cfg = sc._merged(DPO_DEFAULTS, hp, ["model", "train_file", "output_dir"])
    argv = [sc.swift_bin(hp), "rlhf", "--rlhf_type", "dpo",
            *sc._model_data_args(cfg),
            *sc._dtype_args(cfg),
            *sc._lora_args(cfg),
            *sc._optim_args(cfg),
            "--max_length", str(cfg["max_length"]),
            "--beta", str(cfg["beta"]),
            "--loss_type", str(cfg["loss_type"]),
            *sc._output_args(cfg)]
    if hp.get("rpo_alpha") is not None or "rpo_alpha" not in hp:
        argv += ["--rpo_alpha", str(cfg["rpo_alpha"])]
    return argv + sc._resume_args(cfg)


def dpo_hparams(cfg: dict) -> dict:
    """The `swift rlhf` hyper-parameters: pref's (its sampling keys left out), the device and the base model's swift
    type, with `precision` resolved for this machine as SFT's is."""
    p, device = {k: v for k, v in cfg["pref"].items() if k not in NOT_SWIFT}, cfg["train"]["device"]
    return {**p, "device": device, "precision": resolve_dtype(p.get("precision"), device), **base_model_swift(cfg)}


def check_pairs(cfg: dict, pairs: str, summary: str | None = None) -> int:
    """The number of pairs, or a QrewriteError naming why there are too few (pref.min_pairs)."""
    n, floor = len(read_jsonl(pairs)), cfg["pref"]["min_pairs"]
    if n >= floor:
        return n
    why = ""
    if summary and Path(summary).is_file():
        doc = read_json(summary)
        why = f" ({doc['rows_with_gold']} training rows with gold; no pair: {doc['no_pair']})"
    raise QrewriteError(f"{n} preference pair(s), fewer than pref.min_pairs ({floor}){why}: DPO on so few moves the "
                        "student by noise", file=pairs,
                        hint="sample more or more varied rewrites (pref.samples, pref.temperature), lower "
                             "pref.min_pairs, or set pref.enabled: false for this config")


def loss_history(run_dir: str | Path) -> list[dict]:
    """Per logged step: loss, the SFT term (nll_loss), reward margin and accuracy (trl's DPO metrics)."""
    keep = ("loss", "nll_loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected")
    out = []
    for rec in runner.read_log_history(run_dir):
        if "loss" not in rec:
            continue
        step = rec.get("global_step/max_steps", "")
        out.append({"step": int(str(step).split("/")[0]) if step else None,
                    **{k: float(rec[k]) for k in keep if k in rec}})
    return out


def run_dpo(cfg: dict, *, model: str, pairs: str, adapter_out: str, out: str, run_dir: str, tb_dir: str,
            log_file: str | None = None, threads: int | None = None) -> dict:
    """Train (or resume a killed run of the same command), copy the last checkpoint's adapter to `adapter_out`,
    merge it into `model` → `out`. Returns stats."""
    hp = dpo_hparams(cfg)
    shutil.rmtree(tb_dir, ignore_errors=True)  # a rule output: Snakemake deletes it before a rerun anyway
    cmd = {**hp, "model": model, "train_file": pairs, "output_dir": run_dir, "logging_dir": tb_dir,
           "num_layers": sc.model_num_layers(model) if hp.get("lora_layers") else None}
    argv = dpo_cmd(cmd)
    ck = (resume.last_complete_hf_checkpoint(run_dir)
          if resume.prepare_run_dir(run_dir, resume.fingerprint(argv, [model, pairs])) else None)
    if ck:
        argv = dpo_cmd({**cmd, "resume_from_checkpoint": str(ck)})
    wall = runner.run_swift(argv, log_file=log_file, env={"OMP_NUM_THREADS": str(threads)} if threads else None)
    last = runner.last_checkpoint(run_dir)
    save_adapter(last, adapter_out, "last")
    merged = merge_lora(cfg, base=model, adapter=adapter_out, out=out, log_file=log_file, threads=threads)
    resume.mark_finished(run_dir)
    hist = loss_history(run_dir)
    return {"wall_s": round(wall, 1), "merge_wall_s": merged["wall_s"], "resumed_from": ck.name if ck else None,
            "checkpoint": last.name, "steps": max((h["step"] or 0 for h in hist), default=0),
            "first": hist[0] if hist else None, "last": hist[-1] if hist else None, "history": hist,
            "hparams": hp}
