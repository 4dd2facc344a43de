"""Teacher behind any OpenAI-compatible chat API (GPT-5, DeepSeek, a vLLM server, `transformers serve`)."""

from __future__ import annotations

from ..openai_chat import CallFailed, OpenAIChat, choices


class OpenAITeacher(OpenAIChat):
    role = "teacher"

    def __init__(self, ocfg: dict, prices: dict):
        super().__init__(ocfg, "teacher.openai", "teacher.provider is openai",
                         hint=f"export {ocfg['api_key_env']}=... or use teacher.provider: prf for the embedded teacher")
        self.price = prices.get(self.model)

    def cost(self, usage: dict) -> float | None:
        if self.price is None or not usage:
            return None
        return round(usage.get("prompt_tokens", 0) * self.price["input_per_1m"] / 1e6
                     + usage.get("completion_tokens", 0) * self.price["output_per_1m"] / 1e6, 8)

    def _reply(self, resp) -> dict:
        first = choices(resp)[0]
        content = first.message.content if first.message else None
        if not content or not content.strip():
            raise CallFailed(f"empty rewrite (finish_reason={first.finish_reason})", transient=False)
        usage = resp.usage.model_dump() if resp.usage else {}
        usage = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return {"rewrite": content.strip(), "usage": usage, "model": resp.model or self.model}

    async def rewrite(self, messages: list[dict]) -> dict:
        """Return {rewrite, usage, model, latency_s, attempts} or raise CallFailed / QrewriteError."""
        out, attempts, latency_s = await self.call(messages, self._reply)
        return out | {"latency_s": latency_s, "attempts": attempts}
