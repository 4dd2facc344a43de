"""Preference optimisation of the rewrite student with ms-swift (the pref stage): `swift rlhf --rlhf_type dpo` (or
`kto`) with LoRA on the merged SFT model, then the adapter merged into it.

The reference model is the merged SFT model itself: with LoRA, ms-swift (trl) computes the reference log-probabilities
with the adapter switched off, so no second model is loaded (`--ref_model` is refused with LoRA). The pairs
(`pairs.py`) carry the SFT prompt as `messages` with the chosen rewrite as the assistant turn and the rejected one as
`rejected_response`: ms-swift's DPO row, rendered with the SFT template. `rpo_alpha` adds the SFT loss on the chosen
text (RPO), so the student keeps writing what SFT taught while it learns the preference.

KTO (`--rlhf_type kto`) learns from unpaired examples (`pairs.build_examples`: every sample that misses gold is
undesirable, each row's chosen text desirable), so a tenant whose student already puts gold first on most of its
training rows, which leaves few rows with both a winner and a loser, still gives it every loser to learn from.
`pref.method: auto` runs DPO where there are pref.min_pairs pairs and KTO where there are not but there are
pref.min_undesirable undesirable examples (`choose_method`). Fewer stop the stage: a handful of examples moves the
model by noise, and a copy of the SFT model under another name would be a candidate that is not what its name says.
The stage's error names the counts and what to set (more samples, a higher temperature, lower floors, or
pref.enabled: false).

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

# pref's keys that are not swift's hyper-parameters (sampling, the floors, the method, the switch)
NOT_SWIFT = ("enabled", "method", "samples", "temperature", "top_p", "max_new_tokens", "sample_batch_size",
             "min_pairs", "min_undesirable")
# DPO's alone (KTO has its own loss and no SFT term), and KTO's alone
DPO_ONLY = ("rpo_alpha", "loss_type")
KTO_ONLY = ("desirable_weight", "undesirable_weight")

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


def _rlhf_argv(rlhf_type: str, hp: Mapping[str, Any], cfg: Mapping[str, Any], own: list[str]) -> list[str]:
    """``swift rlhf --rlhf_type <type>`` with LoRA on a local jsonl: what DPO and KTO share, `own` (the method's
    loss arguments) after beta, then the checkpoints and the resume point."""
    return [sc.swift_bin(hp), "rlhf", "--rlhf_type", rlhf_type,
            *sc._model_data_args(cfg),
            *sc._dtype_args(cfg),
            *sc._lora_args(cfg),
            *sc._optim_args(cfg),
            "--max_length", str(cfg["max_length"]),
            "--beta", str(cfg["beta"]),
            *own,
            *sc._output_args(cfg),
            *sc._resume_args(cfg)]


def dpo_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift rlhf --rlhf_type dpo`` with LoRA on a local pairs jsonl (rows: ``messages`` ending in the chosen
    assistant turn, ``rejected_response``). Required: model, train_file, output_dir. Optional: logging_dir,
    resume_from_checkpoint, everything in DPO_DEFAULTS (rpo_alpha None: no SFT term)."""
    cfg = sc._merged(DPO_DEFAULTS, hp, ["model", "train_file", "output_dir"])
    own = ["--loss_type", str(cfg["loss_type"])]
    if hp.get("rpo_alpha") is not None or "rpo_alpha" not in hp:
        own += ["--rpo_alpha", str(cfg["rpo_alpha"])]
    return _rlhf_argv("dpo", hp, cfg, own)


KTO_DEFAULTS: dict[str, Any] = {**{k: v for k, v in DPO_DEFAULTS.items() if k not in DPO_ONLY},
                                "desirable_weight": 1.0, "undesirable_weight": 1.0}


def kto_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift rlhf --rlhf_type kto`` with LoRA on a local examples jsonl (rows: ``messages`` ending in an assistant
    turn, ``label`` true for desirable). Required: model, train_file, output_dir. KTO's KL reference point pairs each
    example with another of its batch: per_device_train_batch_size × gradient_accumulation_steps must be over 1."""
    cfg = sc._merged(KTO_DEFAULTS, {k: v for k, v in hp.items() if k not in DPO_ONLY},
                     ["model", "train_file", "output_dir"])
    if cfg["per_device_train_batch_size"] * cfg["gradient_accumulation_steps"] < 2:
        raise QrewriteError("KTO needs at least 2 examples per step (its KL term pairs each with another)",
                            hint="raise pref.per_device_train_batch_size or pref.gradient_accumulation_steps")
    return _rlhf_argv("kto", hp, cfg, ["--desirable_weight", str(cfg["desirable_weight"]),
                                       "--undesirable_weight", str(cfg["undesirable_weight"])])


def pref_hparams(cfg: dict, method: str) -> dict:
    """The `swift rlhf` hyper-parameters of `method`: pref's (its sampling keys left out, and DPO's own keys for
    KTO), the device and the base model's swift type, with `precision` resolved for this machine as SFT's is."""
    drop = NOT_SWIFT + (DPO_ONLY if method == "kto" else KTO_ONLY)
    p, device = {k: v for k, v in cfg["pref"].items() if k not in drop}, cfg["train"]["device"]
    return {**p, "device": device, "precision": resolve_dtype(p.get("precision"), device), **base_model_swift(cfg)}


def _counts(pairs: str, examples: str) -> dict:
    ex = read_jsonl(examples)
    return {"pairs": len(read_jsonl(pairs)), "desirable": sum(bool(e["label"]) for e in ex),
            "undesirable": sum(not e["label"] for e in ex)}


def choose_method(cfg: dict, pairs: str, examples: str, summary: str | None = None) -> tuple[str, dict]:
    """("dpo" | "kto", counts) by pref.method, or a QrewriteError naming the counts and the floors when neither may
    run: DPO needs pref.min_pairs pairs; KTO pref.min_undesirable undesirable examples and one desirable."""
    p, n = cfg["pref"], _counts(pairs, examples)
    dpo_ok = n["pairs"] >= p["min_pairs"]
    kto_ok = n["undesirable"] >= p["min_undesirable"] and n["desirable"] >= 1
    method = p.get("method", "auto")
    if method in ("dpo", "auto") and dpo_ok:
        return "dpo", n
    if method in ("kto", "auto") and kto_ok:
        return "kto", n
    why = ""
    if summary and Path(summary).is_file():
        doc = read_json(summary)
        why = f" ({doc['rows_with_gold']} training rows with gold; no pair: {doc['no_pair']})"
    need = {"dpo": f"pref.min_pairs ({p['min_pairs']}) pairs",
            "kto": f"pref.min_undesirable ({p['min_undesirable']}) undesirable examples"}
    wanted = " or ".join(need[m] for m in (("dpo", "kto") if method == "auto" else (method,)))
    raise QrewriteError(f"{n['pairs']} preference pair(s), {n['undesirable']} undesirable and {n['desirable']} "
                        f"desirable example(s){why}; pref.method {method} needs {wanted}: so few move the student "
                        "by noise", file=pairs,
                        hint="sample more or more varied rewrites (pref.samples, pref.temperature), lower the floor "
                             "(pref.min_pairs, pref.min_undesirable), or set pref.enabled: false for this config")


def loss_history(run_dir: str | Path) -> list[dict]:
    """Per logged step: loss, the SFT term (nll_loss, DPO), reward margin and accuracy, and KTO's KL estimate
    (trl's DPO and KTO metrics)."""
    keep = ("loss", "nll_loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected", "kl")
    out = []
    for rec in runner.read_log_history(run_dir):
        if "loss" not in rec:
            continue
        step = rec.get("global_step/max_steps", "")
        out.append({"step": int(str(step).split("/")[0]) if step else None,
                    **{k: float(rec[k]) for k in keep if k in rec}})
    return out


def run_pref(cfg: dict, method: str, *, model: str, data: str, adapter_out: str, out: str, run_dir: str,
             tb_dir: str, counts: dict | None = None, log_file: str | None = None, threads: int | None = None) -> dict:
    """Train `method` ("dpo" on the pairs, "kto" on the examples: `data`), or resume a killed run of the same command;
    copy the last checkpoint's adapter to `adapter_out`, merge it into `model` → `out`. Returns stats."""
    hp = pref_hparams(cfg, method)
    if method == "kto" and counts and counts["desirable"] < counts["undesirable"]:
        # fewer desirable than undesirable (rows where nothing puts gold first): the KTO paper's weighting,
        # λ_D·n_D / (λ_U·n_U) at 1
        hp["desirable_weight"] = max(hp.get("desirable_weight") or 1.0,
                                     round(counts["undesirable"] / counts["desirable"], 2))
    make = {"dpo": dpo_cmd, "kto": kto_cmd}[method]
    shutil.rmtree(tb_dir, ignore_errors=True)  # a rule output: Snakemake deletes it before a rerun anyway
    cmd = {**hp, "model": model, "train_file": data, "output_dir": run_dir, "logging_dir": tb_dir,
           "num_layers": sc.model_num_layers(model) if hp.get("lora_layers") else None}
    argv = make(cmd)
    ck = (resume.last_complete_hf_checkpoint(run_dir)
          if resume.prepare_run_dir(run_dir, resume.fingerprint(argv, [model, data])) else None)
    if ck:
        argv = make({**cmd, "resume_from_checkpoint": str(ck)})
    wall = runner.run_swift(argv, log_file=log_file, env={"OMP_NUM_THREADS": str(threads)} if threads else None)
    last = runner.last_checkpoint(run_dir)
    save_adapter(last, adapter_out, "last")
    merged = merge_lora(cfg, base=model, adapter=adapter_out, out=out, log_file=log_file, threads=threads)
    resume.mark_finished(run_dir)
    hist = loss_history(run_dir)
    return {"method": method, "wall_s": round(wall, 1), "merge_wall_s": merged["wall_s"], "resumed_from": ck.name if ck else None,
            "checkpoint": last.name, "steps": max((h["step"] or 0 for h in hist), default=0),
            "first": hist[0] if hist else None, "last": hist[-1] if hist else None, "history": hist,
            "hparams": hp}
