"""Where a released model's rewrite of one request comes from.

* `InProcessBackend`: the model loaded in the gateway (`qrewrite.eval.generate.LocalRewriter`), each request
  rewritten alone (`SERVED_BATCH_SIZE`), one at a time per model, in a worker thread: the computation the eval's
  release candidate ran, so the same text;
* `OpenAIBackend`: an OpenAI-compatible server (vLLM, `swift deploy`) asked with the same prompt, greedy, the
  release's max_new_tokens; its completion is finished by the eval's own `finish_completion` (cleaned, loops
  trimmed, degeneracy judged).

Both raise `BackendFailed` (reason `backend_timeout` or `backend_error`) and nothing else for a failed rewrite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading

from ..errors import QrewriteError
from ..eval.generate import SERVED_BATCH_SIZE, finish_completion
from ..prompts import rewrite_messages

log = logging.getLogger(__name__)


class BackendFailed(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# Shared by every in-process model: a thread each, so two tenants' requests generate side by side (torch releases
# the GIL in its ops), while one model's requests queue on its lock.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="qrewrite-gen")


class InProcessBackend:
    kind = "inprocess"

    def __init__(self, model_dir: str, tenant: dict, decoding: dict, device: str):
        from ..eval.generate import LocalRewriter

        if decoding.get("batch_size", SERVED_BATCH_SIZE) != SERVED_BATCH_SIZE:
            raise QrewriteError("a served release generates each request alone", file=model_dir)
        self.rewriter = LocalRewriter(
            model_dir, tenant, max_new_tokens=decoding["max_new_tokens"], device=device, threads=None,
            repetition_penalty=decoding.get("repetition_penalty"),
            no_repeat_ngram_size=decoding.get("no_repeat_ngram_size"), copy_bias=decoding.get("copy_bias"),
            trim_loops=bool(decoding.get("trim_loops")), dtype=decoding.get("dtype"),
            prefix_cache=decoding.get("prefix_cache", True))
        self.lock = threading.Lock()
        self.describe = {"backend": self.kind, "model_dir": model_dir, "device": device,
                         "dtype": str(self.rewriter.model.dtype)}

    def _one(self, row: dict) -> dict:
        with self.lock:
            results, _ = self.rewriter.rewrite([row], batch_size=SERVED_BATCH_SIZE)
        return results[0]

    async def generate(self, row: dict, timeout_s: float) -> dict:
        fut = asyncio.get_running_loop().run_in_executor(_POOL, self._one, row)
        try:
            # a generation cannot be stopped half-way: past the timeout the request is answered without it, and the
            # thread finishes it for nobody (the next request on this model queues behind it)
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            raise BackendFailed("backend_timeout", f"no rewrite within {timeout_s:g} s") from None
        except Exception as exc:  # noqa: BLE001 - the model failed on this row: said, never raised to the client
            raise BackendFailed("backend_error", f"{type(exc).__name__}: {str(exc)[:200]}") from None

    async def aclose(self) -> None:
        pass


class OpenAIBackend:
    kind = "openai"

    def __init__(self, base_url: str, model: str, api_key_env: str | None, tenant: dict, decoding: dict):
        from openai import AsyncOpenAI

        for unsupported in ("copy_bias", "no_repeat_ngram_size"):
            if decoding.get(unsupported):
                raise QrewriteError(f"the release's decoding sets {unsupported}, which an OpenAI-compatible server "
                                    "does not take", hint="serve it with serve.backend: inprocess")
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            raise QrewriteError(f"environment variable {api_key_env} is not set (serve.openai.api_key_env)",
                                hint="export the backend's key, or set serve.openai.api_key_env: null")
        # the SDK wants a key; a backend without one ignores it. Retries are the gateway's fallback, not the SDK's.
        self.client = AsyncOpenAI(base_url=base_url, api_key=key or "no-key", max_retries=0)
        self.model, self.tenant, self.decoding = model, tenant, decoding
        self.describe = {"backend": self.kind, "base_url": base_url, "model": model}

    async def generate(self, row: dict, timeout_s: float) -> dict:
        from openai import APIError

        extra = {"repetition_penalty": self.decoding["repetition_penalty"]} \
            if self.decoding.get("repetition_penalty") else None
        try:
            resp = await self.client.chat.completions.create(
                model=self.model, messages=rewrite_messages(self.tenant, row), temperature=0.0,
                max_tokens=self.decoding["max_new_tokens"], timeout=timeout_s, extra_body=extra)
        except APIError as exc:
            reason = "backend_timeout" if "timed out" in str(exc).lower() or type(exc).__name__ == "APITimeoutError" \
                else "backend_error"
            raise BackendFailed(reason, f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not resp.choices:
            raise BackendFailed("backend_error", "the backend answered no choice")
        raw = resp.choices[0].message.content
        finished = resp.choices[0].finish_reason != "length"
        usage = resp.usage
        return {**finish_completion(raw, row, finished=finished, trim_loops=bool(self.decoding.get("trim_loops"))),
                "raw_completion": raw, "finished": finished,
                "new_tokens": usage.completion_tokens if usage else None,
                "prompt_tokens": usage.prompt_tokens if usage else None}

    async def aclose(self) -> None:
        await self.client.close()
