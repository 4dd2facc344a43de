"""The distilled judge as the reward's judge (``reward.judge.provider: model``): a local Hugging Face model that
reads ``qrewrite.reward.judge_prompt`` and replies ``{"reason": "...", "score": N}``, served in process, no network.

Its score is the expected value of the score digit under the model (sum of k * p(k) over the digits 1-5 where it
writes the score), so two candidates rarely tie the way two integer scores do; the reply must still parse (the API
judge's strict parser), else it is a failed judgement (judge term 0, counted), never a score. Calls that arrive
together (the scorer judges a step's rollouts with asyncio.gather) are generated as one left-padded batch in a
worker thread. Replies are cached on disk by model fingerprint and material, like the API judge's.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
from pathlib import Path

from ..cache import DiskCache, call_key
from ..errors import QrewriteError
from .verdict import Verdict

_SCORE_PREFIX = re.compile(r'"score"\s*:\s*$')


def fingerprint(model_dir: str | os.PathLike) -> str:
    """Config and weight files' sizes and names: enough to tell two trained judges apart in the cache key."""
    h = hashlib.sha256()
    for p in sorted(Path(model_dir).glob("*")):
        if p.is_file() and p.suffix in (".json", ".safetensors", ".jinja"):
            h.update(f"{p.name}:{p.stat().st_size}".encode())
            if p.suffix != ".safetensors":
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


class ModelJudge:
    provider = "model"

    def __init__(self, model_dir: str, cache: DiskCache, *, max_new_tokens: int = 96, batch_size: int = 8,
                 threads: int | None = None, device: str = "cpu", key_terms=None):
        """`key_terms`: reference -> its key terms (``UnitWeights.key_terms`` over the tenant's KB), shown to a
        judge trained with them (reward.judge.model.key_terms); None: not shown."""
        if not Path(model_dir, "config.json").is_file():
            raise QrewriteError("reward.judge.model.path is not a model folder (no config.json)", file=model_dir,
                                hint="train one: snakemake judge (docs/signals.md, the distilled judge)")
        self.model_dir, self.cache = str(model_dir), cache
        self.max_new_tokens, self.batch_size, self.threads, self.device = max_new_tokens, batch_size, threads, device
        self.key_terms = key_terms
        self.fp = fingerprint(model_dir)
        self.model = f"model:{Path(model_dir).name}@{self.fp}"
        self.calls = self.cache_hits = self.failures = 0
        self._lock = threading.Lock()
        self._loaded = None
        self._pending: list = []
        self._flushing = False

    # --- the model, loaded on first use
    def _load(self):
        if self._loaded is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.threads:
                torch.set_num_threads(int(self.threads))
            tok = AutoTokenizer.from_pretrained(self.model_dir)
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            model = AutoModelForCausalLM.from_pretrained(self.model_dir).to(self.device).eval()
            digits = {k: tok.convert_tokens_to_ids(str(k)) for k in range(1, 6)}
            self._loaded = (tok, model, digits)
        return self._loaded

    def generate(self, batch: list[list[dict]]) -> list[tuple[str, float | None]]:
        """(reply text, expected score or None) for each chat in `batch`."""
        import torch

        with self._lock:
            tok, model, digits = self._load()
            prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            with torch.inference_mode():
                out = model.generate(**enc, do_sample=False, max_new_tokens=self.max_new_tokens,
                                     pad_token_id=tok.pad_token_id, temperature=None, top_p=None, top_k=None,
                                     output_scores=True, return_dict_in_generate=True)
            new = out.sequences[:, enc["input_ids"].shape[1]:]
            results = []
            for b, ids in enumerate(new):
                ids = [int(x) for x in ids]
                text = tok.decode(ids, skip_special_tokens=True)
                expected = None
                for step, t in enumerate(ids):  # the step that writes the score digit
                    if t in digits.values() and _SCORE_PREFIX.search(tok.decode(ids[:step])):
                        probs = torch.softmax(out.scores[step][b].float(), dim=-1)
                        p = {k: float(probs[i]) for k, i in digits.items()}
                        expected = sum(k * v for k, v in p.items()) / max(sum(p.values()), 1e-12)
                        break
                results.append((text.strip(), expected))
            return results

    # --- the judge interface (qrewrite.reward.judges)
    async def judge(self, query: str, profile: str, history: str, rewrite: str,
                    reference: str | None = None) -> Verdict:
        from .judge_prompt import messages, read_reply

        terms = self.key_terms(reference) if self.key_terms and reference else None
        chat = messages({"query": query, "profile": profile, "history": history, "reference": reference,
                         "candidate": rewrite, "key_terms": terms})
        key = call_key("model-judge", self.fp, chat, {"max_new_tokens": self.max_new_tokens})
        hit = self.cache.get(key)
        if hit is not None:
            self.cache_hits += 1
            text, expected = hit["content"], hit.get("expected")
        else:
            fut = asyncio.get_running_loop().create_future()
            self._pending.append((chat, fut))
            if not self._flushing:
                self._flushing = True
                asyncio.ensure_future(self._flush())
            text, expected = await fut
            self.calls += 1
            self.cache.put(key, {"content": text, "expected": expected})
        parsed = read_reply(text)
        if parsed is None:
            self.failures += 1
            return Verdict(None, f"unparseable judge reply: {text[:80]!r}", hit is not None)
        score, reason = parsed
        return Verdict(float(expected) if expected is not None else score, reason, hit is not None)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the other calls of the same gather enqueue first: one batch
        try:
            while self._pending:
                batch, self._pending = self._pending[:self.batch_size], self._pending[self.batch_size:]
                try:
                    results = await asyncio.to_thread(self.generate, [c for c, _ in batch])
                except Exception as exc:  # every waiting call gets the error, none hangs
                    for _, fut in batch:
                        fut.set_exception(exc)
                    continue
                for (_, fut), res in zip(batch, results):
                    fut.set_result(res)
        finally:
            self._flushing = False

    def stats(self) -> dict:
        return {"judge_calls": self.calls, "judge_cache_hits": self.cache_hits, "judge_failures": self.failures}

    async def aclose(self) -> None:
        return None
