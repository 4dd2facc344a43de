"""What the OpenAI-compatible teacher and judge share: the key from the environment, the async client, params."""

from __future__ import annotations

from .secret import from_env


class OpenAIChat:
    """Holds `ocfg` (teacher.openai or reward.judge.openai), its key and an AsyncOpenAI client.

    The SDK's own retries are off: the subclasses' retry loops honour Retry-After and count failures per row.
    """

    provider = "openai"

    def __init__(self, ocfg: dict, key_setting: str, needed_because: str, hint: str):
        from openai import AsyncOpenAI  # lazy: the rule judge and the PRF teacher need no SDK

        self.cfg = ocfg
        self._api_key = from_env(ocfg["api_key_env"], key_setting, needed_because, hint=hint)
        self.model = ocfg["model"]
        self.base_url = ocfg["base_url"] or "https://api.openai.com/v1"
        self.client = AsyncOpenAI(api_key=self._api_key, base_url=ocfg["base_url"], timeout=ocfg["timeout_s"],
                                  max_retries=0)

    @property
    def params(self) -> dict:
        return {"temperature": self.cfg["temperature"], "max_tokens": self.cfg["max_tokens"]}
