"""The serving check behind `qrewrite deploy-check`: the tenant's release served through the gateway, as its RAG
service would call it, against what the eval scored.

1. Start the gateway (`qrewrite serve`, one tenant, a fresh random key, loopback) with deploy.backend: the model
   in the gateway (inprocess, the CPU default), or a model server (`vllm serve`, `swift deploy`) it calls; wait
   until it lists the tenant's model. Every server is stopped when the check ends, whatever happens.
2. One untimed warm-up request, then every test row once per `deploy.concurrency` level, each through the OpenAI
   SDK on `/v1/chat/completions` (`load.py`).
3. Stop the servers, then compare: each served text with the eval's release row of the same query (text for text;
   with the inprocess backend a difference fails the check, `deploy.require_identical`), and tie-aware Hit@1 of
   both through the tenant's RAG provider now (paired difference with its interval), beside eval.json's figure.
   Every answer must name the release folder's release (`X-Qrewrite-Release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import secrets
import shlex
import sys
from datetime import datetime, timezone

from ..config import base_model_swift
from ..errors import QrewriteError
from .. import stats
from ..eval.hits import hit_at_1
from ..io_utils import read_json, read_jsonl
from ..metrics import TIE_RULE
from ..runtime.release_file import load_release
from ..serve.keys import key_env
from ..serve.plan import plan as serving_plan
from ..runtime.release import lineage_sha256
from ..procs import free_port
from . import load, server

log = logging.getLogger(__name__)


def _eval_rows(path: str, rows: list[dict]) -> dict[str, dict]:
    """The eval's release rows of the test split, by query id (gold and red-team rows are not the tenant's traffic)."""
    by_id = {r["query_id"]: r for r in read_jsonl(path) if r.get("set", "test") == "test"}
    missing = [r["query_id"] for r in rows if r["query_id"] not in by_id]
    if missing:
        raise QrewriteError(f"{len(missing)} test rows have no release row in the eval (first: {missing[0]})",
                            file=path, hint="rerun the eval of the release (snakemake eval) before the deploy check")
    return by_id


def _text(r: dict) -> str:
    return (r.get("rewrite") or "") if r.get("status") == "ok" else ""


def _threads(eval_rows: dict[str, dict], threads: int | None) -> int | None:
    """The threads the eval generated the release's rows at: the same count gives the same greedy text."""
    gen = next((r["generation"] for r in eval_rows.values() if r.get("generation")), None)
    return (gen or {}).get("threads") or threads


def run_check(cfg: dict, tenant: dict, rows: list[dict], *, config_path: str, release_folder: str, eval_json: str,
              eval_rewrites: str, server_log: str, threads: int | None) -> dict:
    dcfg, ecfg = cfg["deploy"], cfg["eval"]
    name = tenant["name"]
    released = load_release(release_folder)["released"]
    expected_id = f"{name}/{released['name']}@{lineage_sha256(release_folder)[:12]}"
    recorded = read_json(eval_json)["candidates"].get("release")
    if recorded is None:
        raise QrewriteError("eval.json has no candidate 'release'", file=eval_json,
                            hint="keep {name: release, kind: release} in eval.candidates")
    evaluated = _eval_rows(eval_rewrites, rows)
    backend, why = server.choose_backend(dcfg["backend"]) if released["kind"] == "model" else ("rule", "a rule")
    gen = ecfg["generation"]
    device = gen["device"] or cfg["train"]["device"]
    threads = _threads(evaluated, threads or gen["threads"])
    host = dcfg["host"]
    levels = sorted(set(dcfg["concurrency"]))
    key = secrets.token_urlsafe(24)  # this check's own key: nothing else can call its gateway
    model = cfg["serve"]["model_name"].format(tenant=name)
    gport = free_port(host)
    gateway_url = f"http://{host}:{gport}/v1"
    access_log = os.path.join(os.path.dirname(server_log) or ".", "deploy_access.jsonl")
    argv = [sys.executable, "-m", "qrewrite", "serve", "--config", config_path, "--tenant", name, "--host", host,
            "--port", str(gport), "--access-log", access_log, "--release", f"{name}={release_folder}",
            # every level's requests queue on one model: none may fall back for waiting (the texts are compared)
            "--timeout-s", str(dcfg["request_timeout_s"])]
    if threads:
        argv += ["--threads", str(threads)]
    env = {key_env(cfg["serve"]["api_key_env"], name): key}
    if threads and device == "cpu":
        env["OMP_NUM_THREADS"] = str(threads)
    model_server = None
    timeout = dcfg["request_timeout_s"]
    passes = {}
    with contextlib.ExitStack() as stack:
        if backend in ("vllm", "swift"):
            mport = free_port(host)
            swift = base_model_swift(cfg)
            margv = server.server_argv(backend, release_folder, host=host, port=mport, name=model, device=device,
                                       model_type=swift["model_type"], template=swift["template"],
                                       max_batch_size=dcfg["max_batch_size"] or max(levels),
                                       launcher=server.launcher(backend), dtype=released["decoding"].get("dtype"))
            mlog = os.path.join(os.path.dirname(server_log) or ".", "deploy_model_server.log")
            minfo = stack.enter_context(server.serving(margv, base_url=f"http://{host}:{mport}/v1", name=model,
                                                       log_path=mlog, timeout=dcfg["startup_timeout_s"], env=env))
            model_server = {"backend": backend, "command": shlex.join(margv), "startup_s": minfo["startup_s"],
                            "log": mlog}
            argv += ["--backend", "openai", "--openai-base-url", f"http://{host}:{mport}/v1"]
        elif backend == "inprocess":
            argv += ["--backend", "inprocess"]
        info = stack.enter_context(server.serving(argv, base_url=gateway_url, name=model, log_path=server_log,
                                                  timeout=dcfg["startup_timeout_s"], env=env,
                                                  headers={"Authorization": f"Bearer {key}"}))
        warm = asyncio.run(load.warm_up(gateway_url, key, model, tenant, rows[0], max_tokens=gen["max_new_tokens"],
                                        timeout_s=timeout))
        if warm["status"] != "ok":
            raise QrewriteError(f"the gateway did not answer the warm-up request: {warm['reason']}",
                                hint=f"read its log {server_log}")
        for c in levels:
            results, summary = asyncio.run(load.run_level(gateway_url, key, model, tenant, rows, concurrency=c,
                                                          max_tokens=gen["max_new_tokens"], timeout_s=timeout,
                                                          retries_429=10))
            passes[c] = (results, summary)
            log.info("concurrency %d: p50 %.3fs p95 %.3fs, %.3f req/s, %d errors", c,
                     summary["latency_s"]["p50"] or -1, summary["latency_s"]["p95"] or -1,
                     summary["requests_per_s"] or 0, summary["errors"])
    failed = {c: s["errors"] + s["refused_429"] for c, (_, s) in passes.items() if s["errors"] or s["refused_429"]}
    if failed:
        first = next(r for c in failed for r in passes[c][0] if r["status"] != "ok")
        raise QrewriteError(f"requests to the gateway failed (errors by concurrency: {failed}; first: "
                            f"{first['reason']})", hint=f"read the gateway's log {server_log}; raise "
                            "deploy.request_timeout_s / serve.timeout_s if they timed out on a slow machine")
    wrong = [r for _, (res, _) in passes.items() for r in res if r["release"] != expected_id
             or r["release_header"] != expected_id]
    if wrong:
        raise QrewriteError(f"{len(wrong)} answers named another release than {expected_id} (first: "
                            f"{wrong[0]['release']} / header {wrong[0]['release_header']})",
                            hint="the release folder changed during the check: rerun it")

    texts = {"eval": {q: _text(r) for q, r in evaluated.items()}}
    texts.update({f"served_c{c}": {r["query_id"]: r["rewrite"] or "" for r in res} for c, (res, _) in passes.items()})
    scored = hit_at_1(cfg, tenant, rows, texts)
    boot = ecfg["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    eval_h1 = stats.mean_ci(scored["eval"], **bkw)
    by_level, differing = {}, {}
    for c, (res, _) in passes.items():
        served = scored[f"served_c{c}"]
        paired = stats.paired(served, scored["eval"], **bkw)
        diff = [r["query_id"] for r in res if texts[f"served_c{c}"][r["query_id"]] != texts["eval"][r["query_id"]]]
        differing[c] = diff
        by_level[str(c)] = {
            "served": stats.mean_ci(served, **bkw),
            "paired_served_minus_eval": paired,
            "within_noise": None if paired["diff"] is None else paired["ci_low"] <= 0 <= paired["ci_high"],
            "identical_texts": len(rows) - len(diff), "identical_share": round(1 - len(diff) / len(rows), 6),
            "differing": [{"query_id": q, "served": texts[f"served_c{c}"][q], "eval": texts["eval"][q]}
                          for q in diff[:5]],
        }
    head = str(levels[0])
    doc = {
        "tenant": name, "release_folder": release_folder, "released": released, "release_id": expected_id,
        "split": ecfg["split"], "n_queries": len(rows), "n_with_gold": sum(1 for r in rows if r["gold_doc_ids"]),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "device": device, "threads": threads},
        "gateway": {"command": shlex.join(argv), "backend": backend, "why": why, "base_url": gateway_url,
                    "model": model, "startup_s": info["startup_s"], "log": server_log, "access_log": access_log,
                    "key": f"a random key for this check, in ${key_env(cfg['serve']['api_key_env'], name)}"},
        "model_server": model_server,
        "request": {"endpoint": "POST /v1/chat/completions (OpenAI SDK)", "messages": "qrewrite.prompts."
                    "rewrite_messages (the teacher's and SFT's prompt)", "warm_up_requests": 1},
        "latency": {str(c): s for c, (_, s) in passes.items()},
        "rag": {"provider": cfg["rag"]["provider"], "top_k": cfg["rag"]["top_k"]},
        "tie_rule": TIE_RULE,
        "hit_at_1": {
            "served": by_level[head]["served"]["mean"], "eval": eval_h1["mean"],
            "eval_json": recorded["hit_at_1"]["mean"],
            "eval_json_reproduced": _same(recorded["hit_at_1"]["mean"], eval_h1["mean"]),
            "headline_concurrency": levels[0],
            "paired_served_minus_eval": by_level[head]["paired_served_minus_eval"],
            "within_noise": by_level[head]["within_noise"], "eval_ci": eval_h1, "by_concurrency": by_level,
        },
        "texts_identical_to_eval": all(not d for d in differing.values()),
        "production": production(cfg, tenant),
    }
    if backend == "inprocess" and dcfg["require_identical"] and not doc["texts_identical_to_eval"]:
        c, diff = next((c, d) for c, d in differing.items() if d)
        ex = by_level[str(c)]["differing"][0]
        raise QrewriteError(f"the gateway served {len(diff)} text(s) other than the eval's release rows at "
                            f"concurrency {c} (first, query {ex['query_id']}: served {ex['served']!r}, eval "
                            f"{ex['eval']!r}); the same model, prompt, decoding and threads ({threads}) must give the "
                            "same text", hint="the eval and the check must run on the same machine and release; "
                            "rerun the eval of the release, or set deploy.require_identical: false to measure a "
                            "difference")
    return doc


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-6)


def production(cfg: dict, tenant: dict) -> dict:
    """What serves this tenant in production (`qrewrite serve-plan` for all tenants at once)."""
    p = serving_plan(cfg, [tenant])
    return {"tenant": p["tenants"][tenant["name"]], "vllm": [shlex.join(s["argv"]) for s in p["vllm"]],
            "gateway": "qrewrite serve --config config.yaml (serve.*; `qrewrite serve-plan` writes the cluster "
                       "commands and a Slurm script)", "key_env": p["key_env"][tenant["name"]]}
