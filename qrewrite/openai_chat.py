"""What the OpenAI-compatible teacher and judge share: the key from the environment, the async client, the
request parameters of the model's family (`openai_params`), the reply's text, and one retry loop (transient
errors retried with backoff that honours Retry-After; a wrong key, model or URL stops the run, since it would
fail every call the same way, and so does a refusal every call so far got: `REFUSAL_LIMIT`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from collections import Counter

from .errors import QrewriteError, ServiceRefused
from .openai_params import PARAM_SETTING, cap_setting, request_params
from .retry import backoff_delay, retry_after_seconds
from .secret import from_env, redact

# Statuses that would fail every row the same way: stop the stage and say what to fix.
FATAL_STATUS = {401: "the API key was rejected", 403: "access denied", 404: "model or endpoint not found"}
# This many calls refused the same way, and none answered: the request is wrong, stop (rerun after the fix).
REFUSAL_LIMIT = 20


class CallFailed(Exception):
    """One call failed for good; `transient` says whether the service (not the request) was the cause.
    `signature` is what two identical refusals share (the reason without row-specific numbers); `setting` is
    the config key that changes the request, where the refusal names one."""

    def __init__(self, reason: str, transient: bool, signature: str | None = None, setting: str | None = None):
        super().__init__(reason)
        self.reason, self.transient = reason, transient
        self.signature, self.setting = signature or reason, setting


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
        self.params = request_params(ocfg, setting)  # part of every cache key
        self.calls = 0
        self.answered = 0  # calls that got a usable reply
        self._refusals: Counter = Counter()  # signature → count, while no call has been answered
        self._refusal: dict[str, CallFailed] = {}

    def _reason(self, text: str) -> str:
        return redact(text, self._api_key)[:300]

    def request_body(self, messages: list[dict]) -> dict:
        """The chat-completions body (a batch file line carries the same one)."""
        return {"model": self.model, "messages": messages, **self.params}

    def _status_failure(self, exc) -> CallFailed:
        """A non-retryable HTTP status as a CallFailed naming the setting behind the request parameter the API
        named (`param` of the error object: 'temperature', 'max_tokens', ...)."""
        body = exc.body if isinstance(exc.body, dict) else {}
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        param, code = err.get("param"), err.get("code")
        key = PARAM_SETTING.get(param) if isinstance(param, str) else None
        setting = None if key is None else f"{self.setting}.{key}"
        message = err.get("message") if isinstance(err.get("message"), str) else exc.message
        reason = self._reason(f"HTTP {exc.status_code}: {message}")
        return CallFailed(reason, transient=False, setting=setting,
                          signature=f"HTTP {exc.status_code} {code} {param} {reason}")

    def _refused(self, exc: CallFailed) -> None:
        """Count a refusal; when every call so far was refused the same way REFUSAL_LIMIT times, stop."""
        if self.answered:
            return
        self._refusals[exc.signature] += 1
        self._refusal.setdefault(exc.signature, exc)
        if len(self._refusals) == 1 and self._refusals[exc.signature] >= REFUSAL_LIMIT:
            raise self.refusal_error(self._refusals[exc.signature])

    def refusal_error(self, n: int | None = None) -> ServiceRefused:
        """The error that stops a stage whose calls were all refused (`n` of them), naming what to change."""
        signature, count = self._refusals.most_common(1)[0]
        n = count if n is None else n
        exc = self._refusal[signature]
        fix = f"change {exc.setting}" if exc.setting else f"check {self.setting} (model {self.model})"
        return ServiceRefused(f"{self.role} API {self.base_url} refused all {n} calls so far the same way: "
                              f"{exc.reason}", hint=f"{fix}, then rerun: answered calls are cached, nothing "
                              "was written")

    def refused_everything(self) -> bool:
        """No call was answered and every one made was refused the same way (a setting, not the service)."""
        return not self.answered and len(self._refusals) == 1

    async def call(self, messages: list[dict], reply: Callable[[Any], Any]) -> tuple[Any, int, float]:
        """(reply(response), attempts, latency_s of the answered attempt). `reply` turns a completion into the
        result or raises CallFailed (transient: tried again). Raises CallFailed when every attempt failed or
        the request itself was refused, QrewriteError on HTTP 401/403/404 and on REFUSAL_LIMIT refusals."""

        def counted():
            self.calls += 1
            return self.client.chat.completions.create(**self.request_body(messages))

        try:
            out = await self.retrying(counted, reply)
        except CallFailed as exc:
            if not exc.transient:
                self._refused(exc)
            raise
        self.answered += 1
        return out

    async def retrying(self, request: Callable[[], Awaitable], reply: Callable[[Any], Any] = lambda r: r
                       ) -> tuple[Any, int, float]:
        """Run `request()` (an SDK call) with this client's retry policy: (reply(response), attempts,
        latency_s of the answered attempt). The Batch API's calls (teacher.batch) go through it too."""
        import openai

        transient = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                     openai.InternalServerError)
        attempts = int(self.cfg["max_retries"]) + 1
        last = CallFailed("no attempt", transient=True)
        for attempt in range(attempts):
            retry_after = None
            start = time.perf_counter()
            try:
                resp = await request()
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
                raise self._status_failure(exc) from None
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


def reply_text(resp, chat: OpenAIChat) -> str:
    """The reply's text: `message.content`, never deepseek-reasoner's `reasoning_content` (the chain of
    thought beside it). "" when the reply has none, except a reply cut at the token cap before any text
    (reasoning spent it all): that is a refusal naming the cap's setting, never an empty answer."""
    first = choices(resp)[0]
    content = (first.message.content if first.message else None) or ""
    if not content.strip() and first.finish_reason == "length":
        used = usage_of(resp)
        raise CallFailed(f"the reply was cut at the token cap before any text (finish_reason length, "
                         f"{used.get('completion_tokens')} completion tokens, {used.get('reasoning_tokens')} "
                         f"of them reasoning)", transient=False, signature="finish_reason length, no content",
                         setting=f"{cap_setting(chat.cfg, chat.setting)} (raise it) or "
                                 f"{chat.setting}.reasoning_effort (lower it)")
    return content


def usage_of(resp) -> dict:
    """Token counts of a completion; `reasoning_tokens` (hidden, inside completion_tokens, billed as output)
    from completion_tokens_details, 0 where the server reports none."""
    usage = resp.usage.model_dump() if getattr(resp, "usage", None) else {}
    details = usage.get("completion_tokens_details") or {}
    return {**{k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
            "reasoning_tokens": details.get("reasoning_tokens") or 0}


def nothing_usable(chat: OpenAIChat | None, rows: list[dict], what: str) -> QrewriteError | None:
    """The error for an output in which no row is usable (`status` ok), None otherwise: such a stage must not
    exit 0. Every call refused the same way names the setting; anything else names the commonest reason."""
    if not rows or any(r["status"] == "ok" for r in rows):
        return None
    if chat is not None and chat.refused_everything():
        return chat.refusal_error()
    reason, n = Counter(r.get("reason") for r in rows).most_common(1)[0]
    return QrewriteError(f"{what}: none of the {len(rows)} rows got a rewrite ({n} failed with: {reason})",
                         hint="fix the cause and rerun: answered calls are cached, nothing was written")
