"""results/T/queries.jsonl → results/T/teacher.jsonl, one row per query, with a disk cache."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from ..config import tenant_teacher
from ..errors import ServiceUnavailable
from ..prompts import prompt_hash, rewrite_messages
from ..tasks import gather_with_progress
from ..cache import DiskCache, call_key
from ..openai_chat import CallFailed, nothing_usable
from .checks import unchanged_check
from .column import ColumnTeacher
from .openai_teacher import OpenAITeacher
from .prf import PrfTeacher
from .resolve import ResolveTeacher

# After this many transient failures in a row the service is taken to be down: stop, say so, write nothing.
CIRCUIT_BREAKER = 20


def make_teacher(cfg: dict, tenant: dict):
    tcfg = tenant_teacher(cfg, tenant)
    if tcfg["provider"] == "openai":
        return OpenAITeacher(tcfg["openai"], tcfg["prices"], tcfg["batch"]["price_share"])
    if tcfg["provider"] == "column":
        return ColumnTeacher(tenant["columns"]["rewrite"])
    from ..kb import tenant_kb

    if tcfg["provider"] == "resolve":
        return ResolveTeacher.for_tenant(tenant)
    from ..rag.local import LocalRetriever

    loc = cfg["rag"]["local"]
    # PRF expands with raw BM25 weights: the retriever's reranker score plays no part in it.
    retriever = LocalRetriever(tenant_kb(tenant), tenant["language"], loc["k1"], loc["b"])
    return PrfTeacher(retriever, tcfg["prf"])


async def _call(teacher, messages: list[dict], row: dict) -> dict:
    if isinstance(teacher, (PrfTeacher, ResolveTeacher, ColumnTeacher)):
        start = time.perf_counter()
        if isinstance(teacher, ColumnTeacher):
            text = teacher.rewrite_row(row)
            if text is None:
                raise CallFailed(f"empty cell in the reference column {teacher.column!r}", transient=False)
        else:
            text = teacher.rewrite(row["query"], row["profile"], row["history"])
        return {"rewrite": text, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                "model": teacher.model, "latency_s": round(time.perf_counter() - start, 6), "attempts": 1}
    return await teacher.rewrite(messages)


def _request(teacher, tenant: dict, row: dict) -> tuple[list[dict], str]:
    messages = rewrite_messages(tenant, row)
    return messages, call_key(teacher.provider, teacher.model, messages, teacher.params)


async def _batch(teacher, cache: DiskCache, tcfg: dict, tenant: dict, queries: list[dict]) -> dict:
    """teacher.mode batch: the rows not cached go to one Batch API job first (teacher/batch.py); the calls
    below then find its answers in the cache and retry the rest synchronously."""
    from .batch import BatchJobs

    pending = {}
    for row in queries:
        messages, key = _request(teacher, tenant, row)
        if not cache.has(key):
            pending[key] = messages
    return await BatchJobs(teacher, cache, tcfg["batch"], tcfg["cache_dir"]).run(pending)


async def run_teacher(cfg: dict, tenant: dict, queries: list[dict], *, progress: bool = True) -> tuple[list, dict]:
    tcfg = tenant_teacher(cfg, tenant)
    teacher = make_teacher(cfg, tenant)
    cache = DiskCache(tcfg["cache_dir"])
    batch = None
    sem = asyncio.Semaphore(tcfg["concurrency"])
    consecutive_transient = 0
    transient_failures = 0
    new_calls: list[str] = []  # successful calls made in this run (not from cache)
    service_down = asyncio.Event()

    async def one(row: dict) -> dict:
        nonlocal consecutive_transient, transient_failures
        messages, key = _request(teacher, tenant, row)
        base = {"id": row["id"], "provider": teacher.provider, "model": teacher.model,
                "prompt_hash": prompt_hash(messages), "call_key": key}
        hit = cache.get(key)
        if hit is not None:
            return {**base, "status": "ok", "reason": None, **hit}
        async with sem:
            if service_down.is_set():
                return {**base, "status": "error", "reason": "skipped: service down"}
            try:
                out = await _call(teacher, messages, row)
            except CallFailed as exc:
                if exc.transient:
                    transient_failures += 1
                    consecutive_transient += 1
                    if consecutive_transient >= CIRCUIT_BREAKER:
                        service_down.set()
                return {**base, "status": "error", "reason": exc.reason, "rewrite": None, "usage": None,
                        "latency_s": None, "cost_usd": None}
        consecutive_transient = 0
        out["cost_usd"] = teacher.cost(out["usage"]) if isinstance(teacher, OpenAITeacher) else 0.0
        cache.put(key, out)  # persisted the moment it succeeds: a kill after this repeats nothing
        new_calls.append(key)
        return {**base, "status": "ok", "reason": None, **out}

    try:
        if tcfg["mode"] == "batch":
            batch = await _batch(teacher, cache, tcfg, tenant, queries)
        results = await gather_with_progress((one(r) for r in queries),
                                             desc=f"teacher[{tenant['name']}:{teacher.provider}]", progress=progress)
    finally:
        if hasattr(teacher, "aclose"):
            await teacher.aclose()
    # Down: a run of transient failures, or (fewer calls than the breaker) not one call got through.
    # Failing here writes nothing, so Snakemake reruns the stage instead of keeping an all-error output.
    if service_down.is_set() or (transient_failures and not new_calls):
        what = (f"failed {CIRCUIT_BREAKER} calls in a row" if service_down.is_set()
                else f"failed every call it was sent ({transient_failures})")
        raise ServiceUnavailable(
            f"teacher API {getattr(teacher, 'base_url', teacher.provider)} {what} "
            f"(last: {next(r['reason'] for r in results if r['status'] == 'error')})",
            hint="check the service and rerun: successful calls are cached and will not be repeated")
    error = nothing_usable(teacher if isinstance(teacher, OpenAITeacher) else None, results,
                           f"teacher {getattr(teacher, 'base_url', teacher.provider)}")
    if error is not None:
        raise error
    order = {r["id"]: i for i, r in enumerate(queries)}
    results.sort(key=lambda r: order[r["id"]])
    status = Counter(r["status"] for r in results)
    reasons = Counter(r["reason"] for r in results if r["status"] != "ok")
    stats = {"stage": "teacher", "in": len(queries), "out": status["ok"], "dropped": dict(reasons),
             "provider": teacher.provider, "model": teacher.model,
             "cache_hits": cache.hits, "new_calls": len(new_calls),
             "failed_calls": status["error"],
             "tokens": sum((r.get("usage") or {}).get("total_tokens") or 0 for r in results if r["status"] == "ok"),
             "reasoning_tokens": sum((r.get("usage") or {}).get("reasoning_tokens") or 0
                                     for r in results if r["status"] == "ok"),
             "cost_usd": round(sum(r.get("cost_usd") or 0 for r in results if r["status"] == "ok"), 6),
             "prices_read": tcfg["prices_read"], **({"batch": batch} if batch is not None else {}),
             **({"request": teacher.params} if isinstance(teacher, OpenAITeacher) else {}),  # what was sent
             **unchanged_check(queries, results, teacher)}
    return results, stats
