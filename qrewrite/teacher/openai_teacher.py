"""Teacher behind any OpenAI-compatible chat API (GPT-5, DeepSeek, a vLLM server, `transformers serve`)."""

from __future__ import annotations

import asyncio
import time

import openai

from ..errors import QrewriteError
from ..retry import backoff_delay, retry_after_seconds
from ..openai_chat import OpenAIChat
from ..secret import redact

# Errors worth retrying: the same request may succeed later.
_TRANSIENT = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
              openai.InternalServerError)
# Errors that would fail every row the same way: stop the stage and say what to fix.
_FATAL_STATUS = {401: "the API key was rejected", 403: "access denied", 404: "model or endpoint not found"}


class CallFailed(Exception):
    """One call failed for good; `transient` says whether the service (not the request) was the cause."""

    def __init__(self, reason: str, transient: bool):
        super().__init__(reason)
        self.reason, self.transient = reason, transient


class OpenAITeacher(OpenAIChat):
    def __init__(self, ocfg: dict, prices: dict):
        super().__init__(ocfg, "teacher.openai.api_key_env", "teacher.provider is openai",
                         hint=f"export {ocfg['api_key_env']}=... or use teacher.provider: prf for the embedded teacher")
        self.price = prices.get(self.model)

    def cost(self, usage: dict) -> float | None:
        if self.price is None or not usage:
            return None
        return round(usage.get("prompt_tokens", 0) * self.price["input_per_1m"] / 1e6
                     + usage.get("completion_tokens", 0) * self.price["output_per_1m"] / 1e6, 8)

    async def _once(self, messages: list[dict]) -> dict:
        resp = await self.client.chat.completions.create(model=self.model, messages=messages, **self.params)
        if isinstance(resp, str) or not getattr(resp, "choices", None):
            raise CallFailed("response has no choices", transient=True)
        content = resp.choices[0].message.content if resp.choices[0].message else None
        if not content or not content.strip():
            raise CallFailed(f"empty rewrite (finish_reason={resp.choices[0].finish_reason})", transient=False)
        usage = resp.usage.model_dump() if resp.usage else {}
        usage = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return {"rewrite": content.strip(), "usage": usage, "model": resp.model or self.model}

    async def rewrite(self, messages: list[dict]) -> dict:
        """Return {rewrite, usage, model, latency_s, attempts} or raise CallFailed / QrewriteError."""
        attempts = self.cfg["max_retries"] + 1
        last = CallFailed("no attempt", transient=True)
        for attempt in range(attempts):
            retry_after = None
            start = time.perf_counter()
            try:
                out = await self._once(messages)
                out.update(latency_s=round(time.perf_counter() - start, 4), attempts=attempt + 1)
                return out
            except CallFailed as exc:
                last = exc
                if not exc.transient:
                    raise
            except _TRANSIENT as exc:
                last = CallFailed(redact(f"{type(exc).__name__}: {exc}", self._api_key)[:300], transient=True)
                retry_after = retry_after_seconds(getattr(getattr(exc, "response", None), "headers", None))
            except openai.APIStatusError as exc:
                if exc.status_code in _FATAL_STATUS:
                    raise QrewriteError(f"teacher API {self.base_url} answered HTTP {exc.status_code}: "
                                        f"{_FATAL_STATUS[exc.status_code]}",
                                        hint="check teacher.openai.base_url, .model and the key's env var") from None
                raise CallFailed(redact(f"HTTP {exc.status_code}: {exc.message}", self._api_key)[:300],
                                 transient=False) from None
            except (openai.APIResponseValidationError, ValueError) as exc:
                last = CallFailed(redact(f"malformed response: {type(exc).__name__}: {exc}", self._api_key)[:300],
                                  transient=True)
            if attempt + 1 < attempts:
                await asyncio.sleep(backoff_delay(attempt, self.cfg["backoff_base_s"], self.cfg["backoff_max_s"],
                                                  retry_after))
        raise last

    async def aclose(self):
        await self.client.close()
