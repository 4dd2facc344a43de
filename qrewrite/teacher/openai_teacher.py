"""Teacher behind any OpenAI-compatible chat API (GPT-5, DeepSeek, a vLLM server, `transformers serve`)."""

from __future__ import annotations

from ..openai_chat import CallFailed, OpenAIChat, reply_text, usage_of


class OpenAITeacher(OpenAIChat):
    role = "teacher"

    def __init__(self, ocfg: dict, prices: dict, batch_price_share: float = 0.5):
        super().__init__(ocfg, "teacher.openai", "teacher.provider is openai",
                         hint=f"export {ocfg['api_key_env']}=... or use teacher.provider: prf for the embedded teacher")
        self.price = prices.get(self.model)
        self.batch_price_share = batch_price_share

    def cost(self, usage: dict, batch: bool = False) -> float | None:
        """List price of one call: completion_tokens include the hidden reasoning tokens, billed as output.
        A Batch API row costs `batch_price_share` of it (teacher.batch.price_share)."""
        if self.price is None or not usage:
            return None
        share = self.batch_price_share if batch else 1.0
        return round(share * (usage.get("prompt_tokens", 0) * self.price["input_per_1m"] / 1e6
                              + usage.get("completion_tokens", 0) * self.price["output_per_1m"] / 1e6), 8)

    def reply(self, resp) -> dict:
        """{rewrite, usage, model} of a completion (a synchronous reply or a batch output line's body)."""
        content = reply_text(resp, self)
        if not content.strip():
            raise CallFailed(f"empty rewrite (finish_reason={resp.choices[0].finish_reason})", transient=False)
        return {"rewrite": content.strip(), "usage": usage_of(resp), "model": resp.model or self.model}

    async def rewrite(self, messages: list[dict]) -> dict:
        """Return {rewrite, usage, model, latency_s, attempts} or raise CallFailed / QrewriteError."""
        out, attempts, latency_s = await self.call(messages, self.reply)
        return out | {"latency_s": latency_s, "attempts": attempts}
