"""Client for a tenant's RAG service (default shape: POST /api/chat/general_rag)."""

from __future__ import annotations

import asyncio
import math

import httpx

from ..errors import QrewriteError, ServiceUnavailable
from ..retry import backoff_delay, retry_after_seconds
from ..secret import from_env, redact

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def _dig(obj, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


class HttpRag:
    def __init__(self, http_cfg: dict, *, tenant_id: str, kb_name: str, top_k: int, score_threshold: float,
                 concurrency: int):
        self.cfg = http_cfg
        self.fields = http_cfg["fields"]
        self.url = http_cfg["base_url"].rstrip("/") + http_cfg["path"]
        self.tenant_id, self.kb_name = tenant_id, kb_name
        self.top_k, self.score_threshold = top_k, score_threshold
        headers = {}
        self._token = None
        if http_cfg.get("api_key_env"):
            token = from_env(http_cfg["api_key_env"], "rag.http.api_key_env", "rag.http.api_key_env names it",
                             hint="export it, or set rag.http.api_key_env: null")
            headers["Authorization"] = f"Bearer {token}"
            self._token = token
        self.client = httpx.AsyncClient(timeout=http_cfg["timeout_s"], headers=headers)
        self.sem = asyncio.Semaphore(concurrency)
        self.calls = 0

    def _payload(self, query: str, rewritten_query: str | None) -> dict:
        f = self.fields
        return {f["query"]: query, f["rewritten_query"]: rewritten_query or "", f["tenant_id"]: self.tenant_id,
                f["kb_name"]: self.kb_name, f["top_k"]: self.top_k, f["score_threshold"]: self.score_threshold}

    def _parse(self, body, query: str) -> list[dict]:
        f = self.fields
        where = f"RAG response from {self.url} for query {query[:60]!r}"
        recall = _dig(body, f["recall_path"])
        if not isinstance(recall, list):
            raise QrewriteError(
                f"{where} has no list at {f['recall_path']!r} "
                f"(top-level keys: {sorted(body) if isinstance(body, dict) else type(body).__name__})",
                hint="set rag.http.fields.recall_path to where the service puts its results")
        hits = []
        for i, item in enumerate(recall):
            if not isinstance(item, dict) or f["doc_id"] not in item or f["score"] not in item:
                raise QrewriteError(
                    f"{where}: recall[{i}] lacks {f['doc_id']!r} or {f['score']!r}",
                    hint="set rag.http.fields.doc_id / .score to the service's field names")
            doc_id, raw = item[f["doc_id"]], item[f["score"]]
            if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
                raise QrewriteError(f"{where}: recall[{i}].{f['doc_id']} is not a document id: {doc_id!r}"[:300],
                                    hint="the service must return a string or integer id per recalled document")
            try:
                # A number or a numeric string; bools, NaN and infinities are not scores.
                score = float(raw) if not isinstance(raw, bool) else math.nan
            except (TypeError, ValueError):
                score = math.nan
            if not math.isfinite(score):
                raise QrewriteError(f"{where}: recall[{i}].{f['score']} is not a finite number: {raw!r}"[:300],
                                    hint="rag.http.fields.score must name the service's numeric relevance score")
            hits.append({"doc_id": str(doc_id), "content": str(item.get(f["content"], "")),
                         "reranker_score": score})
        hits.sort(key=lambda h: -h["reranker_score"])
        return hits

    async def search(self, query: str, rewritten_query: str | None = None) -> list[dict]:
        attempts = self.cfg["max_retries"] + 1
        last = "no attempt"
        async with self.sem:
            for attempt in range(attempts):
                retry_after = None
                try:
                    self.calls += 1
                    resp = await self.client.post(self.url, json=self._payload(query, rewritten_query))
                    if resp.status_code < 400:
                        try:
                            body = resp.json()
                        except ValueError:
                            last = "response body is not JSON"
                        else:
                            return self._parse(body, rewritten_query or query)
                    elif resp.status_code in RETRY_STATUS:
                        last = f"HTTP {resp.status_code}"
                        retry_after = retry_after_seconds(resp.headers)
                    else:
                        raise QrewriteError(f"RAG service {self.url} answered HTTP {resp.status_code}: "
                                            f"{redact(resp.text, self._token)[:200]}",
                                            hint="check rag.http settings and the request fields")
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    last = redact(f"{type(exc).__name__}: {exc}", self._token)
                if attempt + 1 < attempts:
                    await asyncio.sleep(backoff_delay(attempt, self.cfg["backoff_base_s"], 10.0, retry_after))
        raise ServiceUnavailable(
            f"RAG service {self.url} failed after {attempts} attempts (last: {last})",
            hint="start it (`qrewrite serve-rag` for the local one) or fix rag.http.base_url; rerun resumes")

    async def aclose(self):
        await self.client.aclose()

