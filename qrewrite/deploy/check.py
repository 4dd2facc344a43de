"""The serving check behind `qrewrite deploy-check`: serve the model, load it, score it, write deploy.json.

1. Start the model folder behind an OpenAI-compatible server on loopback (`server.py`) and wait until it
   lists the model; it is stopped when the check ends, whatever happens.
2. One untimed warm-up request, then every eval row once per `deploy.concurrency` level (`load.py`).
3. Stop the server, then send each level's rewrites through the configured RAG provider: tie-aware Hit@1
   against gold. The in-process eval's rewrites of the same model (results/T/eval/<candidate>.jsonl) go
   through the same provider now, so the paired difference served − in-process compares like with like;
   eval.json's recorded Hit@1 is reported beside it (equal unless the RAG service changed since the eval).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import shlex
from datetime import datetime, timezone

from ..config import base_model_swift
from ..errors import QrewriteError
from ..eval import stats
from ..eval.candidates import RULE_REWRITES, deploy_candidate
from ..eval.route import client_rows
from ..eval.hits import hit_at_1
from ..io_utils import read_json, read_jsonl
from ..metrics import TIE_RULE
from ..release.folder import load_release
from . import load, server

log = logging.getLogger(__name__)


def production_commands(cfg: dict, model: str, name: str, max_batch_size: int, device: str,
                        dtype: str | None = None) -> dict:
    """The serve command lines for production (the key from an env var the shell expands, never its value)."""
    prod, swift = cfg["deploy"]["production"], base_model_swift(cfg)
    key = prod["api_key_env"]
    common = dict(host=prod["host"], port=prod["port"], name=name, model_type=swift["model_type"],
                  template=swift["template"], max_batch_size=max_batch_size)
    vllm = server.server_argv("vllm", model, device="cuda", max_model_len=prod["max_model_len"],
                              gpu_memory_utilization=prod["gpu_memory_utilization"], **common)
    sw = server.server_argv("swift", model, device=device, dtype=dtype, **common)
    return {
        "gpu_vllm": f'VLLM_API_KEY="${key}" ' + shlex.join(vllm),
        "swift": shlex.join(sw) + f' --api_key "${key}"',
        "api_key_env": key,
        "note": f"export {key} first; clients send it as `Authorization: Bearer ...`. Greedy decoding and "
                "max_tokens are per request (docs/deploy.md).",
    }


def rule_check(cfg: dict, tenant: dict, rows: list[dict], released: dict, *, spec: dict, model: str,
               recorded: dict, inproc: dict[str, dict]) -> dict:
    """The release is a rule (no model beat it on validation): there is no model to serve. The RAG service
    applies the rule itself; the check applies it to the eval rows, sends them through the RAG provider and
    compares with the eval's in-process rows of the release."""
    served = {r["query_id"]: r["rewrite"] for r in RULE_REWRITES[released["rule"]](spec, rows)}
    texts = {"in_process": {qid: _text(r) for qid, r in inproc.items()}, "served": served}
    scored = hit_at_1(cfg, tenant, rows, texts)
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    paired = stats.paired(scored["served"], scored["in_process"], **bkw)
    inproc_h1 = stats.mean_ci(scored["in_process"], **bkw)
    recorded_h1 = recorded["hit_at_1"]["mean"]
    log.warning("tenant %s: the release is the rule %s (%s): no model to serve; the RAG service sends %s",
                tenant["name"], released["name"], released["rule"], released["sends"])
    return {
        "tenant": tenant["name"], "candidate": spec["name"], "model": None, "release_folder": model,
        "split": cfg["eval"]["split"], "serves": "rule", "released": released,
        "n_queries": len(rows), "n_with_gold": sum(1 for r in rows if r["gold_doc_ids"]),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "note": f"no trained model beat {released['name']} on validation: the tenant gets the rule, not a model. "
                f"Its RAG service sends {released['sends']}; there is no rewrite server to run.",
        "rag": {"provider": cfg["rag"]["provider"], "top_k": cfg["rag"]["top_k"]},
        "tie_rule": TIE_RULE,
        "hit_at_1": {"served": stats.mean_ci(scored["served"], **bkw)["mean"], "in_process": inproc_h1["mean"],
                     "in_process_eval_json": recorded_h1, "eval_json_reproduced": _same(recorded_h1, inproc_h1["mean"]),
                     "paired_served_minus_in_process": paired,
                     "within_noise": None if paired["diff"] is None else paired["ci_low"] <= 0 <= paired["ci_high"],
                     "in_process_ci": inproc_h1,
                     "identical_rewrites": sum(1 for q, t in served.items() if t == texts["in_process"].get(q))},
        "production": {"rule": released["rule"], "sends": released["sends"], "command": None},
    }


def _in_process(path: str, rows: list[dict], candidate: str) -> dict[str, dict]:
    by_id = {r["query_id"]: r for r in read_jsonl(path)}
    missing = [r["query_id"] for r in rows if r["query_id"] not in by_id]
    if missing:
        raise QrewriteError(f"{len(missing)} eval rows have no in-process rewrite (first: {missing[0]})", file=path,
                            hint=f"rerun the eval of candidate {candidate} (snakemake eval) before deploy")
    return by_id


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-6)


def client_step(decoding: dict) -> tuple[str, str] | None:
    """(the lever, what a caller does with each served rewrite before retrieval under it); None: the caller sends
    the served rewrite as it is."""
    if decoding.get("route_by_retrieval"):
        return ("route_by_retrieval", "the caller retrieves with the served rewrite, the rewrite + the row's history "
                "summary and query + history, and keeps the one whose top hit scores highest (release decoding "
                "route_by_retrieval; qrewrite.eval.route)")
    if decoding.get("append_history"):
        return ("append_history", "the caller pastes the row's history summary after each served rewrite before "
                "retrieval (release decoding append_history; qrewrite.eval.route.with_history)")
    return None


def _text(r: dict) -> str:
    return (r.get("rewrite") or "").strip() if r.get("status") == "ok" else ""


def run_check(cfg: dict, tenant: dict, rows: list[dict], *, model: str, eval_json: str, eval_rewrites: str,
              server_log: str, threads: int | None) -> dict:
    dcfg, ecfg = cfg["deploy"], cfg["eval"]
    spec = deploy_candidate(cfg)
    released = load_release(model)["released"] if spec["kind"] == "release" else None
    recorded = read_json(eval_json)["candidates"].get(spec["name"])
    if recorded is None:
        raise QrewriteError(f"eval.json has no candidate {spec['name']!r}", file=eval_json,
                            hint="rerun snakemake eval with deploy.candidate among eval.candidates")
    inproc = _in_process(eval_rewrites, rows, spec["name"])
    if released is not None and released["kind"] == "rule":
        return rule_check(cfg, tenant, rows, released, spec=spec, model=model, recorded=recorded, inproc=inproc)
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise QrewriteError("not a Hugging Face model folder (no config.json)", file=model,
                            hint="build it first: snakemake models (deploy serves the release by default)")
    decoding = {**ecfg["generation"], **(spec.get("generation") or {}), **((released or {}).get("decoding") or {})}
    if decoding.get("copy_bias"):
        log.warning("copy_bias is set (eval.generation, or the decoding the release chose): the in-process eval "
                    "biased decoding towards each row's own "
                    "tokens, which the server does not (an OpenAI API caller can send it as logit_bias with vLLM; "
                    "swift deploy ignores it): served and in-process rewrites may differ")
    step = client_step(decoding)
    if step:
        log.warning("%s is set (the decoding the release chose): the server returns the model's rewrite; %s, as "
                    "this check does", *step)
    if decoding.get("trim_loops"):
        log.warning("trim_loops is set: the in-process eval cut looping rewrites where the loop "
                    "began; a served rewrite is measured as the server returns it (a caller can cut it the same "
                    "way: qrewrite.eval.degenerate.trim_loop)")
    levels = sorted(set(dcfg["concurrency"]))
    gen = ecfg["generation"]
    device = gen["device"] or cfg["train"]["device"]
    threads = threads or gen["threads"]
    backend, why = server.choose_backend(dcfg["backend"])
    host = dcfg["host"]
    port = dcfg["port"] or server.free_port(host)
    name = dcfg["served_model_name"].format(tenant=tenant["name"])
    batch = dcfg["max_batch_size"] or max(levels)
    swift = base_model_swift(cfg)
    argv = server.server_argv(backend, model, host=host, port=port, name=name, device=device,
                              model_type=swift["model_type"], template=swift["template"], max_batch_size=batch,
                              launcher=server.launcher(backend), dtype=decoding.get("dtype"))
    env = {"OMP_NUM_THREADS": str(threads)} if threads and device == "cpu" else {}
    base_url = f"http://{host}:{port}/v1"
    max_tokens = gen["max_new_tokens"]
    timeout = dcfg["request_timeout_s"]

    passes = {}
    with server.serving(argv, base_url=base_url, name=name, log_path=server_log, timeout=dcfg["startup_timeout_s"],
                        env=env) as info:
        warm = asyncio.run(load.warm_up(base_url, name, tenant, rows[0], max_tokens=max_tokens, timeout_s=timeout))
        if warm["status"] != "ok":
            raise QrewriteError(f"the served model did not answer the warm-up request: {warm['reason']}",
                                hint=f"read the server log {server_log}")
        for c in levels:
            results, summary = asyncio.run(load.run_level(base_url, name, tenant, rows, concurrency=c,
                                                          max_tokens=max_tokens, timeout_s=timeout))
            passes[c] = (results, summary)
            log.info("concurrency %d: p50 %.3fs p95 %.3fs, %.3f req/s, %d errors", c, summary["latency_s"]["p50"] or -1,
                     summary["latency_s"]["p95"] or -1, summary["requests_per_s"] or 0, summary["errors"])
    failed = {c: s["errors"] for c, (_, s) in passes.items() if s["errors"]}
    if failed:
        first = next(r for c in failed for r in passes[c][0] if r["status"] != "ok")
        raise QrewriteError(f"requests to the served model failed (errors by concurrency: {failed}; first: "
                            f"{first['reason']})", hint=f"read the server log {server_log}; raise "
                            "deploy.request_timeout_s if they timed out on a slow machine")

    texts = {"in_process": {qid: _text(r) for qid, r in inproc.items()}}
    texts.update({f"served_c{c}": {r["query_id"]: _text(r) for r in res} for c, (res, _) in passes.items()})
    if step:
        # the caller's step, as the in-process eval took it: what is sent to the RAG for each served text
        for c in passes:
            served = texts[f"served_c{c}"]
            sent = client_rows(decoding, cfg, tenant, rows, [served[r["query_id"]] for r in rows])
            texts[f"served_c{c}"] = {r["query_id"]: f["rewrite"] if served[r["query_id"]] else ""
                                     for r, f in zip(rows, sent)}
    scored = hit_at_1(cfg, tenant, rows, texts)
    boot = ecfg["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    inproc_h1 = stats.mean_ci(scored["in_process"], **bkw)

    by_level = {}
    for c, (res, _) in passes.items():
        served = scored[f"served_c{c}"]
        paired = stats.paired(served, scored["in_process"], **bkw)
        same = sum(1 for r in res if texts[f"served_c{c}"][r["query_id"]] == texts["in_process"][r["query_id"]])
        by_level[str(c)] = {
            "served": stats.mean_ci(served, **bkw),
            "paired_served_minus_in_process": paired,
            # None: no row with gold, nothing to compare
            "within_noise": None if paired["diff"] is None else paired["ci_low"] <= 0 <= paired["ci_high"],
            "identical_rewrites": same, "identical_share": round(same / len(rows), 6),
        }
    head = str(levels[0])
    recorded_h1 = recorded["hit_at_1"]["mean"]
    return {
        "tenant": tenant["name"], "candidate": spec["name"], "model": model, "split": ecfg["split"],
        "serves": "model", "released": released,
        "n_queries": len(rows), "n_with_gold": sum(1 for r in rows if r["gold_doc_ids"]),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "device": device, "threads": threads},
        "server": {"backend": backend, "why": why, "command": shlex.join(argv), "base_url": base_url,
                   "served_model_name": name, "max_batch_size": batch, "startup_s": info["startup_s"],
                   "log": server_log},
        "request": {"endpoint": "POST /v1/chat/completions", "messages": "qrewrite.prompts.rewrite_messages "
                    "(the eval's and SFT's prompt)", "temperature": 0.0, "max_tokens": max_tokens,
                    "stream": False, "warm_up_requests": 1},
        "latency": {str(c): s for c, (_, s) in passes.items()},
        # how the in-process eval generated (batched rewrites pad: greedy text can differ from one request's)
        "in_process": {"generation": next((r["generation"] for r in inproc.values() if r.get("generation")), None),
                       "latency_s_eval_json": recorded.get("latency_s")},
        "rag": {"provider": cfg["rag"]["provider"], "top_k": cfg["rag"]["top_k"]},
        "tie_rule": TIE_RULE,
        "hit_at_1": {
            "served": by_level[head]["served"]["mean"],
            "in_process": inproc_h1["mean"],
            "in_process_eval_json": recorded_h1,
            "eval_json_reproduced": _same(recorded_h1, inproc_h1["mean"]),
            "headline_concurrency": levels[0],
            "paired_served_minus_in_process": by_level[head]["paired_served_minus_in_process"],
            "within_noise": by_level[head]["within_noise"],
            "in_process_ci": inproc_h1,
            "by_concurrency": by_level,
        },
        "production": production_commands(cfg, model, name, batch, device, decoding.get("dtype")),
        # the release's decoding includes a step the server cannot take: the caller's
        "client_step": step[1] if step else None,
    }

