"""Send every eval row to the served model at a fixed client concurrency; per-request latency and throughput.

Each request is what a tenant's RAG service sends: POST /v1/chat/completions with the eval's (and SFT's)
prompt, `qrewrite.prompts.rewrite_messages`, greedy (temperature 0) and eval.generation.max_new_tokens.
Latency is the client's wall time of one non-streaming call (queueing in the server included); the SDK's
own retries are off, so a failure is a failure and a slow answer is not hidden behind a retry.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from openai import APIError, AsyncOpenAI

from ..eval import stats
from ..eval.degenerate import degeneracy, source_text, summarize
from ..eval.generate import clean_completion
from ..prompts import rewrite_messages


def client(base_url: str, timeout_s: float) -> AsyncOpenAI:
    # The check's server is on loopback without a key; the SDK requires a non-empty one.
    return AsyncOpenAI(base_url=base_url, api_key="not-needed-on-loopback", timeout=timeout_s, max_retries=0)


async def _one(api: AsyncOpenAI, sem: asyncio.Semaphore, model: str, tenant: dict, row: dict,
               max_tokens: int) -> dict:
    async with sem:
        start = time.perf_counter()
        try:
            resp = await api.chat.completions.create(model=model, messages=rewrite_messages(tenant, row),
                                                     temperature=0.0, max_tokens=max_tokens)
        except APIError as exc:
            return {"query_id": row["query_id"], "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300],
                    "rewrite": None, "latency_s": round(time.perf_counter() - start, 6), "completion_tokens": None}
        latency = time.perf_counter() - start
    raw = resp.choices[0].message.content if resp.choices else None
    tokens = resp.usage.completion_tokens if resp.usage is not None else None
    finish = resp.choices[0].finish_reason if resp.choices else None
    rewrite = clean_completion(raw)
    return {"query_id": row["query_id"], "status": "ok", "reason": None, "raw_completion": raw,
            "rewrite": rewrite, "latency_s": round(latency, 6), "completion_tokens": tokens,
            "finish_reason": finish,
            # the same question eval asks of a rewrite; "length" = cut by max_tokens
            "degenerate": degeneracy(rewrite, source=source_text(row),
                                     finished=None if finish is None else finish != "length")}


async def run_level(base_url: str, model: str, tenant: dict, rows: list[dict], *, concurrency: int,
                    max_tokens: int, timeout_s: float) -> tuple[list[dict], dict]:
    """(per-row results in row order, summary) for one pass over `rows` with `concurrency` in flight."""
    api = client(base_url, timeout_s)
    sem = asyncio.Semaphore(concurrency)
    try:
        start = time.perf_counter()
        results = list(await asyncio.gather(*(_one(api, sem, model, tenant, r, max_tokens) for r in rows)))
        wall = time.perf_counter() - start
    finally:
        await api.close()
    ok = [r for r in results if r["status"] == "ok"]
    tokens = [r["completion_tokens"] for r in ok]
    lat = [r["latency_s"] for r in ok]
    summary = {
        "concurrency": concurrency, "effective_concurrency": min(concurrency, len(rows)), "n": len(rows),
        "errors": len(results) - len(ok),
        "latency_s": {"p50": stats.percentile(lat, 50), "p95": stats.percentile(lat, 95),
                      "mean": round(sum(lat) / len(lat), 6) if lat else None, "max": max(lat) if lat else None},
        "wall_s": round(wall, 6),
        "requests_per_s": round(len(ok) / wall, 6) if wall > 0 else None,
        # None, not a guess, when the server left out usage
        "completion_tokens": sum(tokens) if ok and None not in tokens else None,
        "completion_tokens_per_s": round(sum(tokens) / wall, 6) if ok and None not in tokens and wall > 0 else None,
        "finish_reasons": dict(sorted(Counter(str(r.get("finish_reason")) for r in ok).items())),
        "degenerate": summarize([r["degenerate"] for r in ok], [r["query_id"] for r in ok],
                                [r["rewrite"] for r in ok]),
    }
    return results, summary


async def warm_up(base_url: str, model: str, tenant: dict, row: dict, *, max_tokens: int, timeout_s: float) -> dict:
    """One untimed request first, as the in-process eval generates once before timing."""
    results, _ = await run_level(base_url, model, tenant, [row], concurrency=1, max_tokens=max_tokens,
                                 timeout_s=timeout_s)
    return results[0]
