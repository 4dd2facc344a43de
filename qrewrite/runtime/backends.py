"""Where a released model's rewrite of one request comes from.

* `InProcessBackend`: the model loaded in the gateway (`qrewrite.runtime.generate.LocalRewriter`), its requests
  batched by a `BatchingEngine` (`engine.py`): a request that finds the model idle is generated alone, the
  computation of the eval's release row;
* `OpenAIBackend`: an OpenAI-compatible server (vLLM, `swift deploy`) asked with the same prompt, greedy, the
  release's max_new_tokens; its completion is finished by the eval's own `finish_completion` (cleaned, loops
  trimmed, degeneracy judged). With `adapter` set, the release's LoRA adapter is loaded into the server under a
  name that carries the release id (vLLM's runtime `POST /v1/load_lora_adapter`) before the release serves, so
  the weights that answer are the release's that the answer names.

Both raise `BackendFailed` (reason `backend_timeout`, `backend_error` or `backend_closed`) for a failed rewrite;
the in-process one raises `engine.Overloaded` at once when its queue is full.
"""

from __future__ import annotations

import asyncio
import logging
import os

from ..errors import QrewriteError
from ..prompts import rewrite_messages
from .engine import BatchingEngine, Closed
from .generate import SERVED_BATCH_SIZE, finish_completion

log = logging.getLogger(__name__)


# The engine a release names (release.json, its lineage, every answer's `release.engine`)
ENGINE_NAME = "transformers-batched"


class BackendFailed(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class InProcessBackend:
    """The released model loaded in the gateway, its requests batched by a `BatchingEngine` of its own. A request
    that finds the engine idle is generated alone (`SERVED_BATCH_SIZE`): the computation of the eval's release row."""

    kind = "inprocess"

    def __init__(self, model_dir: str, tenant: dict, decoding: dict, device: str, *, max_batch: int = 1,
                 max_queued: int = 0):
        from .generate import LocalRewriter

        if decoding.get("batch_size", SERVED_BATCH_SIZE) != SERVED_BATCH_SIZE:
            raise QrewriteError("a served release generates a request that finds its model idle alone",
                                file=model_dir)
        self.rewriter = LocalRewriter(
            model_dir, tenant, max_new_tokens=decoding["max_new_tokens"], device=device, threads=None,
            repetition_penalty=decoding.get("repetition_penalty"),
            no_repeat_ngram_size=decoding.get("no_repeat_ngram_size"), copy_bias=decoding.get("copy_bias"),
            trim_loops=bool(decoding.get("trim_loops")), dtype=decoding.get("dtype"),
            prefix_cache=decoding.get("prefix_cache", True))
        if decoding.get("prefix_cache", True):
            # the tenant's prompt start computed once, for a request alone and in a batch alike: the same
            # computation either way, so a batch answers the texts the same requests get alone
            self.rewriter.fix_prefix()
        self.engine = BatchingEngine(self._batch, name=tenant["name"], max_batch=max_batch, max_queued=max_queued)
        self.describe = {"backend": self.kind, "engine": ENGINE_NAME, "device": device,
                         "dtype": str(self.rewriter.model.dtype), "max_batch": self.engine.max_batch}

    def healthy(self) -> bool:
        """False once the engine's worker has stopped (closed, or dead)."""
        return self.engine.alive()

    def _batch(self, rows: list[dict]) -> list[dict]:
        results, _ = self.rewriter.rewrite(rows, batch_size=len(rows))
        return results

    async def generate(self, row: dict, timeout_s: float) -> dict:
        """The model's rewrite of `row`; raises `Overloaded` at once past capacity, `BackendFailed` on a timeout
        (its queued work dropped) or an error."""
        try:
            fut = self.engine.submit(row, deadline_s=timeout_s)
        except Closed as exc:
            raise BackendFailed("backend_closed", str(exc)) from None
        waiter = asyncio.wrap_future(fut)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            fut.cancel()  # still queued: dropped; already generating: finishes for nobody
            raise BackendFailed("backend_timeout", f"no rewrite within {timeout_s:g} s") from None
        except asyncio.CancelledError:  # the caller went away (a client that disconnected)
            fut.cancel()
            raise
        except Closed as exc:
            raise BackendFailed("backend_closed", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the model failed on this row: said, never raised to the client
            raise BackendFailed("backend_error", f"{type(exc).__name__}: {str(exc)[:200]}") from None

    async def aclose(self, drain_s: float = 0.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close, drain_s)


class OpenAIBackend:
    kind = "openai"

    def __init__(self, base_url: str, model: str, api_key_env: str | None, tenant: dict, decoding: dict,
                 adapter: dict | None = None):
        """`adapter`: {name, path}: the release's LoRA adapter, loaded into the server under `name` by `prepare`
        (vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), then asked for by that name."""
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
        self.base_url, self.key, self.adapter, self.loaded = base_url.rstrip("/"), key, adapter, False
        self.model, self.tenant, self.decoding = (adapter["name"] if adapter else model), tenant, decoding
        self.describe = {"backend": self.kind, "engine": "openai-server", "model": self.model,
                         "runtime_lora": bool(adapter)}
        self.in_flight, self.last_error = 0, None

    async def _admin(self, path: str, body: dict) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(f"{self.base_url}/{path}", json=body, headers=headers)
        if r.status_code != 200:
            raise QrewriteError(f"the model server refused {path} for {body.get('lora_name')} (HTTP {r.status_code}: "
                                f"{r.text[:300]})", hint="start vLLM with --enable-lora and "
                                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (qrewrite serve-plan's script does)")

    async def prepare(self) -> None:
        """Load the release's adapter into the server (once): the weights this release's answers come from."""
        if self.adapter and not self.loaded:
            await self._admin("load_lora_adapter", {"lora_name": self.adapter["name"],
                                                    "lora_path": self.adapter["path"]})
            self.loaded = True

    async def generate(self, row: dict, timeout_s: float) -> dict:
        self.in_flight += 1
        try:
            out = await self._generate(row, timeout_s)
        except BackendFailed as exc:
            self.last_error = exc.reason
            raise
        finally:
            self.in_flight -= 1
        self.last_error = None
        return out

    def healthy(self) -> bool:
        """False after a failed request, until one succeeds."""
        return self.last_error is None

    async def _generate(self, row: dict, timeout_s: float) -> dict:
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

    async def aclose(self, drain_s: float = 0.0) -> None:
        """Close once the requests in flight have finished, or after `drain_s`."""
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_s
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.05)
        if self.loaded:  # the swapped-out release's adapter leaves the server with it
            try:
                await self._admin("unload_lora_adapter", {"lora_name": self.adapter["name"]})
            except Exception as exc:  # noqa: BLE001 - the new release serves either way; said
                log.warning("unloading adapter %s failed: %s", self.adapter["name"], str(exc)[:200])
            self.loaded = False
        await self.client.close()
