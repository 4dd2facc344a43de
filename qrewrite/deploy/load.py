"""Send every test row to the gateway at a fixed client concurrency, as a tenant's RAG service sends it; per-request
latency and throughput.

Each request is what the RAG sends: the OpenAI SDK's `chat.completions.create` on the gateway's
`/v1/chat/completions`, `model` the tenant's (`<tenant>-rewriter`), the teacher's and SFT's prompt
(`qrewrite.prompts.rewrite_messages`), its key as the bearer token. Latency is the client's wall time of one
non-streaming call (queueing in the gateway included); the SDK's own retries are off, so a failure is a failure
and a slow answer is not hidden behind a retry. The reply's text is what the RAG retrieves with; the gateway's
`qrewrite` field and `X-Qrewrite-Release` header say how it was made and by which release.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from openai import APIError, AsyncOpenAI, RateLimitError

from .. import stats
from ..prompts import rewrite_messages


def client(base_url: str, api_key: str, timeout_s: float) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)


async def _one(api: AsyncOpenAI, sem: asyncio.Semaphore, model: str, tenant: dict, row: dict,
               max_tokens: int, retries_429: int = 0) -> dict:
    refusals = 0
    async with sem:
        start = time.perf_counter()
        while True:
            try:
                raw = await api.chat.completions.with_raw_response.create(
                    model=model, messages=rewrite_messages(tenant, row), temperature=0.0, max_tokens=max_tokens)
                resp = raw.parse()
                break
            except RateLimitError as exc:  # the gateway's admission control: answered at once, never a fallback
                refusals += 1
                retry_after = exc.response.headers.get("retry-after")
                if refusals > retries_429:
                    return {"query_id": row["query_id"], "status": "refused", "reason": f"429: {exc}"[:300],
                            "rewrite": None, "latency_s": round(time.perf_counter() - start, 6),
                            "completion_tokens": None, "retry_after": retry_after, "refusals": refusals}
                # what a client does with a 429: wait as told, then ask again (counted, and in the latency)
                await asyncio.sleep(float(retry_after or 1))
            except APIError as exc:
                return {"query_id": row["query_id"], "status": "error",
                        "reason": f"{type(exc).__name__}: {exc}"[:300], "rewrite": None,
                        "latency_s": round(time.perf_counter() - start, 6), "completion_tokens": None,
                        "refusals": refusals}
        latency = time.perf_counter() - start
    extra = (resp.model_extra or {}).get("qrewrite") or {}
    return {"query_id": row["query_id"], "status": "ok", "reason": None,
            "rewrite": resp.choices[0].message.content if resp.choices else None,
            "model_rewrite": extra.get("model_rewrite"), "routed_to": extra.get("routed_to"),
            "fallback": extra.get("fallback"), "release": (extra.get("release") or {}).get("id"),
            "release_header": raw.headers.get("x-qrewrite-release"), "request_id": raw.headers.get("x-request-id"),
            "latency_s": round(latency, 6), "refusals": refusals, "finish_reason": resp.choices[0].finish_reason
            if resp.choices else None,
            "completion_tokens": resp.usage.completion_tokens if resp.usage is not None else None}


async def run_level(base_url: str, api_key: str, model: str, tenant: dict, rows: list[dict], *, concurrency: int,
                    max_tokens: int, timeout_s: float, retries_429: int = 0) -> tuple[list[dict], dict]:
    """(per-row results in row order, summary) for one pass over `rows` with `concurrency` in flight. A request
    refused with 429 is asked again after its Retry-After, `retries_429` times at most (0: a refusal is final)."""
    api = client(base_url, api_key, timeout_s)
    sem = asyncio.Semaphore(concurrency)
    try:
        start = time.perf_counter()
        results = list(await asyncio.gather(*(_one(api, sem, model, tenant, r, max_tokens, retries_429) for r in rows)))
        wall = time.perf_counter() - start
    finally:
        await api.close()
    ok = [r for r in results if r["status"] == "ok"]
    tokens = [r["completion_tokens"] for r in ok]
    lat = [r["latency_s"] for r in ok]
    summary = {
        "concurrency": concurrency, "effective_concurrency": min(concurrency, len(rows)), "n": len(rows),
        "errors": sum(1 for r in results if r["status"] == "error"),
        "refused_429": sum(1 for r in results if r["status"] == "refused"),
        "answers_429": sum(r.get("refusals", 0) for r in results),
        "latency_s": {"p50": stats.percentile(lat, 50), "p95": stats.percentile(lat, 95),
                      "mean": round(sum(lat) / len(lat), 6) if lat else None, "max": max(lat) if lat else None},
        "wall_s": round(wall, 6),
        "requests_per_s": round(len(ok) / wall, 6) if wall > 0 else None,
        # None, not a guess, where the gateway left out usage (a rule has no tokens: 0)
        "completion_tokens": sum(tokens) if ok and None not in tokens else None,
        "fallbacks": dict(sorted(Counter(r["fallback"] for r in ok if r["fallback"]).items())),
        "routed_to": dict(sorted(Counter(r["routed_to"] for r in ok if r["routed_to"]).items())),
    }
    return results, summary


async def warm_up(base_url: str, api_key: str, model: str, tenant: dict, row: dict, *, max_tokens: int,
                  timeout_s: float) -> dict:
    """One untimed request first, as the in-process eval generates once before timing."""
    results, _ = await run_level(base_url, api_key, model, tenant, [row], concurrency=1, max_tokens=max_tokens,
                                 timeout_s=timeout_s)
    return results[0]
