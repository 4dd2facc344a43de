"""What the OpenAI-compatible teacher and judge share: the key from the environment, the async client, params,
and one retry loop (transient errors retried with backoff that honours Retry-After; a wrong key, model or URL
stops the run, since it would fail every call the same way)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from .errors import QrewriteError
from .retry import backoff_delay, retry_after_seconds
from .secret import from_env, redact

# Statuses that would fail every row the same way: stop the stage and say what to fix.
FATAL_STATUS = {401: "the API key was rejected", 403: "access denied", 404: "model or endpoint not found"}


class CallFailed(Exception):
    """One call failed for good; `transient` says whether the service (not the request) was the cause."""

    def __init__(self, reason: str, transient: bool):
        super().__init__(reason)
        self.reason, self.transient = reason, transient


class OpenAIChat:
    """Holds `ocfg` (teacher.openai or reward.judge.openai), its key and an AsyncOpenAI client.

    The SDK's own retries are off: `call` retries itself, honouring Retry-After and counting attempts per row.
    """

    provider = "openai"
    role = "chat"  # "teacher" / "judge": how errors name the service

    def __init__(self, ocfg: dict, setting: str, needed_because: str, hint: str):
        from openai import AsyncOpenAI  # lazy: the rule judge and the PRF teacher need no SDK

        self.cfg = ocfg
        self.setting = setting  # "teacher.openai": named in errors, with the key's env var
        self._api_key = from_env(ocfg["api_key_env"], f"{setting}.api_key_env", needed_because, hint=hint)
        self.model = ocfg["model"]
        self.base_url = ocfg["base_url"] or "https://api.openai.com/v1"
        self.client = AsyncOpenAI(api_key=self._api_key, base_url=ocfg["base_url"], timeout=ocfg["timeout_s"],
                                  max_retries=0)
        self.calls = 0

    @property
    def params(self) -> dict:
        return {"temperature": self.cfg["temperature"], "max_tokens": self.cfg["max_tokens"]}

    def _reason(self, text: str) -> str:
        return redact(text, self._api_key)[:300]

    async def call(self, messages: list[dict], reply: Callable[[Any], Any]) -> tuple[Any, int, float]:
        """(reply(response), attempts, latency_s of the answered attempt). `reply` turns a completion into the
        result or raises CallFailed (transient: tried again). Raises CallFailed when every attempt failed or
        the request itself was refused, QrewriteError on HTTP 401/403/404."""
        import openai

        transient = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                     openai.InternalServerError)
        attempts = int(self.cfg["max_retries"]) + 1
        last = CallFailed("no attempt", transient=True)
        for attempt in range(attempts):
            retry_after = None
            start = time.perf_counter()
            try:
                self.calls += 1
                resp = await self.client.chat.completions.create(model=self.model, messages=messages,
                                                                 **self.params)
                return reply(resp), attempt + 1, round(time.perf_counter() - start, 4)
            except CallFailed as exc:
                last = exc
                if not exc.transient:
                    raise
            except transient as exc:
                last = CallFailed(self._reason(f"{type(exc).__name__}: {exc}"), transient=True)
                retry_after = retry_after_seconds(getattr(getattr(exc, "response", None), "headers", None))
            except openai.APIStatusError as exc:
                if exc.status_code in FATAL_STATUS:
                    raise QrewriteError(f"{self.role} API {self.base_url} answered HTTP "
                                        f"{exc.status_code}: {FATAL_STATUS[exc.status_code]}",
                                        hint=f"check {self.setting}.base_url, .model and the key's env var"
                                        ) from None
                raise CallFailed(self._reason(f"HTTP {exc.status_code}: {exc.message}"), transient=False) from None
            except (openai.APIResponseValidationError, ValueError) as exc:
                last = CallFailed(self._reason(f"malformed response: {type(exc).__name__}: {exc}"), transient=True)
            if attempt + 1 < attempts:
                await asyncio.sleep(backoff_delay(attempt, self.cfg["backoff_base_s"], self.cfg["backoff_max_s"],
                                                  retry_after))
        raise last

    async def aclose(self):
        await self.client.close()


def choices(resp) -> list:
    """A completion's choices; a body that is not a completion (no choices, a proxy's text page) is a
    service glitch, retried and never taken (or cached) as an answer."""
    if isinstance(resp, str) or not getattr(resp, "choices", None):
        raise CallFailed("malformed response: no choices", transient=True)
    return resp.choices
