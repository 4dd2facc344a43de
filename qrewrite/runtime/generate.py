"""Rewrites from a local Hugging Face model: greedy decoding with plain transformers (ms-swift env).

The prompt is exactly what SFT trained on: `qrewrite.prompts.rewrite_messages` rendered with the
tokenizer's chat template plus the generation prompt. The completion is cleaned with the RL reward's
`clean_rollout` (drops end-of-turn and other template tokens), so eval scores what RL optimised.

Rewrites are generated in batches (`batch_size`), which on a CPU costs a fraction of one query at a time.
`compute_s` is a query's share of its batch's wall time and is what local cost is charged on. Latency is
what one request alone would wait: the first `latency_sample` queries are generated again at batch 1 and
timed, and only they carry a `latency_s` (with `batch_size: 1` every query is timed alone anyway). The
model load and one warm-up generation are not timed (a server pays them once).

Every prompt of a run starts with the same tokens (the chat template's system turn and the user turn's first
label: 56 of a dur-dev prompt's ~99). Their keys and values are computed once and reused by every batch
(`shared_prefix_len`; transformers' documented prompt-cache reuse): each row is the prefix, its padding, then its
own tokens, and positions follow the attention mask, so a row sees the tokens it saw left-padded. On 176 dur-dev
rows at 2 threads it gave the same rewrites in 0.60x the time, 0.67-0.70x on the demo tenants (docs/benchmarks.md).
Single-request latency is still timed on the whole prompt: what a server without a prompt cache would wait.
"""

from __future__ import annotations

import copy
import logging
import time

from ..errors import QrewriteError
from ..hardware import cpu_has_bf16, resolve_dtype
from ..prompts import rewrite_messages

log = logging.getLogger(__name__)


def clean_completion(raw: str | None) -> str:
    """The rewrite in a completion, as RL scored it (`clean_rollout`); the served check uses it too."""
    from ..reward.scorer import clean_rollout

    # a multi-byte character cut by max_new_tokens decodes to U+FFFD: residue, not text
    return clean_rollout(raw).rstrip("\ufffd").strip()


def shared_prefix_len(seqs: list[list[int]]) -> int:
    """How many leading tokens every sequence shares, leaving each at least one token of its own (generation
    needs an uncached token to start from)."""
    if not seqs:
        return 0
    limit = min(len(s) for s in seqs) - 1
    first = seqs[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return n


class CopyBias:
    """A transformers logits processor: +bias on the logits of the tokens of each row's own source text (question,
    profile, history), so greedy decoding prefers what the user wrote over what the model half remembers."""

    def __init__(self, sources: list[list[int]], bias: float):
        self.sources, self.bias = [sorted(set(s)) for s in sources], bias

    def __call__(self, input_ids, scores):
        for i, ids in enumerate(self.sources):
            if ids:
                scores[i, ids] += self.bias
        return scores


# A served request is generated alone: the gateway's in-process backend and the eval's release candidate both
# rewrite one row at a time, so the texts the tenant gets are the texts the eval scored (a padded batch can change a
# greedy rewrite: docs/deploy.md).
SERVED_BATCH_SIZE = 1

# eval.generation's keys that are generate_rewrites' keyword arguments as they are: one list, so a new decoding
# setting reaches every caller (eval, release, the rl stage's check, the GPU check, the bench) in one edit
DECODING_KEYS = ("batch_size", "max_new_tokens", "repetition_penalty", "no_repeat_ngram_size", "copy_bias",
                 "trim_loops", "prefix_cache", "dtype")


def generation_kwargs(gen: dict, **overrides) -> dict:
    """generate_rewrites' keyword arguments from an eval.generation block; `overrides` add or replace (threads,
    device, latency_sample, or a key of the block a caller leaves out on purpose, e.g. copy_bias=None, or the GPU
    check's dtype="float32")."""
    return {**{k: gen[k] for k in DECODING_KEYS}, **overrides}


def weights_dtype(dtype: str | None, device: str):
    """The torch dtype the model is loaded in (`qrewrite.hardware.resolve_dtype`). bfloat16 on a CPU halves the
    bytes each decoding step reads and runs its matrix products on the CPU's bf16 units (AVX512-BF16 / AMX): 1.7-4.8x
    faster here, no student lower on validation (8 measured) (docs/training.md). A CPU without them emulates bf16,
    slower than float32: said in the log."""
    import torch

    dtype = resolve_dtype(dtype, device)
    if dtype == "bfloat16" and device == "cpu" and not cpu_has_bf16():
        log.warning("eval.generation.dtype is bfloat16 but this CPU has no bf16 instructions (avx512_bf16 / "
                    "amx_bf16): torch emulates them, slower than float32; set eval.generation.dtype: auto (or float32)")
    return getattr(torch, dtype)


def finish_completion(raw: str | None, row: dict, *, finished: bool | None, trim_loops: bool) -> dict:
    """{rewrite, loop_trimmed, degenerate} of one completion: cleaned as RL scored it (`clean_completion`), a loop
    cut where it began (`trim_loops`; then judged as finished), and why it is not a rewrite (qrewrite.runtime.degenerate),
    else None. In-process generation and the gateway's remote backends finish a completion with this one function."""
    from .degenerate import degeneracy, source_text, trim_loop

    rewrite = clean_completion(raw)
    why = degeneracy(rewrite, source=source_text(row), finished=finished)
    trimmed = bool(trim_loops and why == "loop")
    if trimmed:  # stopped where the loop began: judged as a finished rewrite
        rewrite = trim_loop(rewrite)
        why = degeneracy(rewrite, source=source_text(row), finished=True)
    return {"rewrite": rewrite, "loop_trimmed": trimmed, "degenerate": why}


class LocalRewriter:
    """A local Hugging Face model loaded once, rewriting rows with greedy decoding (`rewrite`). The eval builds one
    per candidate and rewrites every row in batches; the gateway (`qrewrite serve`) keeps one per tenant and
    rewrites each request alone (batch 1), as the eval's release candidate does (`SERVED_BATCH_SIZE`)."""

    def __init__(self, model_dir: str, tenant: dict, *, max_new_tokens: int, device: str,
                 threads: int | None = None, repetition_penalty: float | None = None,
                 no_repeat_ngram_size: int | None = None, copy_bias: float | None = None,
                 trim_loops: bool = False, dtype: str | None = None, prefix_cache: bool = True):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(int(threads))
        if device == "cuda" and not torch.cuda.is_available():
            raise QrewriteError("eval.generation.device is cuda but no GPU is visible",
                                hint="set eval.generation.device: cpu, or run on a GPU node")
        try:
            tok = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=weights_dtype(dtype, device)).to(device)
        except (OSError, ValueError) as exc:
            raise QrewriteError(f"cannot load the model: {exc}", file=model_dir,
                                hint="a model candidate needs a merged Hugging Face folder (config.json, weights, "
                                     "tokenizer), e.g. models/T/sft-merged") from None
        if tok.chat_template is None:
            raise QrewriteError("the tokenizer has no chat template", file=model_dir,
                                hint="SFT and eval both render prompts with the tokenizer's chat template")
        tok.padding_side = "left"  # decoder-only batch generation: pad on the left so outputs line up
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model.eval()
        eos = model.generation_config.eos_token_id
        self.eos_ids = {int(e) for e in ([eos] if isinstance(eos, int) else (eos or []))} | {int(tok.eos_token_id)}
        self.guards = {k: v for k, v in (("repetition_penalty", repetition_penalty),
                                         ("no_repeat_ngram_size", no_repeat_ngram_size)) if v}
        self.tok, self.model, self.tenant, self.device = tok, model, tenant, device
        self.model_dir, self.max_new_tokens, self.copy_bias = model_dir, max_new_tokens, copy_bias
        self.trim_loops, self.prefix_cache = trim_loops, prefix_cache
        self.warm = False
        self.fixed = None  # (prefix token ids, their cache): `fix_prefix`

    def fix_prefix(self) -> int:
        """Compute once the keys and values of the tokens every prompt of this tenant starts with (the chat
        template's system turn and the user turn's start), and use them for every later `rewrite`, one row or a
        batch: a request is then the same computation alone or batched ([prefix, padding, own tokens], the padding
        masked), so a served batch gives the texts the same requests get alone. The serving engine calls it.
        Returns the prefix's length in tokens (0: none found)."""
        import torch

        probes = [{"query": q, "profile": None, "history": None} for q in ("甲", "乙 b")] + \
                 [{"query": "x", "profile": "p", "history": "h"}]
        ids = [self.tok(self.prompt(r), add_special_tokens=False).input_ids for r in probes]
        n = shared_prefix_len(ids)
        if n:
            with torch.inference_mode():
                cache = self.model(torch.tensor([ids[0][:n]], device=self.device), use_cache=True).past_key_values
            self.fixed = (ids[0][:n], cache)
        return n

    def prompt(self, row: dict) -> str:
        return self.tok.apply_chat_template(rewrite_messages(self.tenant, row), add_generation_prompt=True,
                                            tokenize=False)

    def _run(self, batch: list[dict], new_tokens: int, ids: list[list[int]] | None = None, prefix=(), cache=None):
        """Greedy completions of `batch`; given its token `ids` and a `cache`, only each row's own tokens are
        computed: [prefix, padding, own tokens], the padding masked. Without, whole prompts, left-padded."""
        import torch

        tok, extra = self.tok, {}
        if ids is None or cache is None:
            enc = tok([self.prompt(r) for r in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        else:
            prefix = list(prefix)
            own = [x[len(prefix):] for x in ids]
            width = max(len(o) for o in own)
            enc = {"input_ids": torch.tensor([prefix + [tok.pad_token_id] * (width - len(o)) + o for o in own]),
                   "attention_mask": torch.tensor([[1] * len(prefix) + [0] * (width - len(o)) + [1] * len(o)
                                                   for o in own])}
            extra["past_key_values"] = copy.deepcopy(cache)
            extra["past_key_values"].batch_repeat_interleave(len(batch))
        enc = {k: v.to(self.device) for k, v in enc.items()}
        if self.copy_bias:
            from transformers import LogitsProcessorList

            from .degenerate import source_text

            sources = [tok(source_text(r), add_special_tokens=False).input_ids for r in batch]
            extra["logits_processor"] = LogitsProcessorList([CopyBias(sources, float(self.copy_bias))])
        with torch.inference_mode():
            out = self.model.generate(**enc, do_sample=False, max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id,
                                      temperature=None, top_p=None, top_k=None, **self.guards, **extra)
        return out[:, enc["input_ids"].shape[1]:]

    def _timed(self, batch: list[dict], ids=None, prefix=(), cache=None):
        import torch

        start = time.perf_counter()
        new = self._run(batch, self.max_new_tokens, ids, prefix, cache)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return new, time.perf_counter() - start

    def rewrite(self, rows: list[dict], *, batch_size: int, latency_sample: int = 0) -> tuple[list[dict], dict]:
        """([{query_id, rewrite, raw_completion, latency_s, compute_s, new_tokens, finished, loop_trimmed,
        degenerate}], info) for `rows`, in their order (`generate_rewrites` says what each field is)."""
        import torch

        tok = self.tok
        if rows and not self.warm:
            self._run(rows[:1], 4)  # warm-up, untimed
            self.warm = True
        # Batches of similar prompt length waste little compute on padding (a red-team row can be 5x a test
        # row); results go back in the rows' order.
        token_ids = [tok(self.prompt(r), add_special_tokens=False).input_ids for r in rows]
        order = sorted(range(len(rows)), key=lambda i: len(token_ids[i]))
        prefix_len = shared_prefix_len(token_ids) if self.prefix_cache and batch_size > 1 else 0
        prefix, cache = [], None
        fixed = self.fixed
        if fixed is not None and all(len(t) > len(fixed[0]) and t[:len(fixed[0])] == fixed[0] for t in token_ids):
            prefix_len, prefix, cache = len(fixed[0]), fixed[0], fixed[1]  # the tenant's, for one row or many
        elif prefix_len:
            prefix = token_ids[0][:prefix_len]
            with torch.inference_mode():
                cache = self.model(torch.tensor([prefix], device=self.device), use_cache=True).past_key_values
        results: list[dict | None] = [None] * len(rows)
        for i in range(0, len(rows), batch_size):
            idx = order[i:i + batch_size]
            new, wall = self._timed([rows[j] for j in idx], [token_ids[j] for j in idx], prefix, cache)
            for j, ids in zip(idx, new):
                raw = tok.decode(ids, skip_special_tokens=False)
                finished = any(int(x) in self.eos_ids for x in ids)  # ended its turn before max_new_tokens
                results[j] = {"query_id": rows[j].get("query_id"), **finish_completion(
                                  raw, rows[j], finished=finished, trim_loops=self.trim_loops),
                              "raw_completion": raw, "latency_s": round(wall, 6) if batch_size == 1 else None,
                              "compute_s": round(wall / len(idx), 6), "new_tokens": int((ids != tok.pad_token_id).sum()),
                              "prompt_tokens": len(token_ids[j]), "finished": finished}
            if len(rows) > 1:
                log.info("generated %d/%d", min(i + batch_size, len(rows)), len(rows))
        if batch_size > 1:
            for res, row in zip(results, rows[:latency_sample]):
                res["latency_s"] = round(self._timed([row])[1], 6)
            log.info("single-request latency timed on %d queries", min(latency_sample, len(rows)))
        guards = dict(self.guards)
        if self.copy_bias:
            guards["copy_bias"] = self.copy_bias
        if self.trim_loops:
            guards["trim_loops"] = sum(bool(r["loop_trimmed"]) for r in results)
            if guards["trim_loops"] and len(rows) > 1:
                log.warning("%d rewrite(s) looped and were cut where the loop began (eval.generation.trim_loops)",
                            guards["trim_loops"])
        info = {"device": self.device, "threads": torch.get_num_threads(), "batch_size": batch_size,
                "latency_sample": len(rows) if batch_size == 1 else min(latency_sample, len(rows)),
                "max_new_tokens": self.max_new_tokens, "decoding_guards": guards, "cached_prefix_tokens": prefix_len,
                "dtype": str(self.model.dtype), "torch": torch.__version__}
        return results, info


def generate_rewrites(model_dir: str, tenant: dict, rows: list[dict], *, batch_size: int, max_new_tokens: int,
                      threads: int | None, device: str, latency_sample: int = 0,
                      repetition_penalty: float | None = None,
                      no_repeat_ngram_size: int | None = None,
                      copy_bias: float | None = None, trim_loops: bool = False,
                      dtype: str | None = None, prefix_cache: bool = True) -> tuple[list[dict], dict]:
    """([{query_id, rewrite, raw_completion, latency_s, compute_s, new_tokens, finished, degenerate}], info) for
    `rows`. `degenerate`: why the rewrite is not one (qrewrite.runtime.degenerate), else None; the rewrite is kept as
    generated. repetition_penalty / no_repeat_ngram_size: transformers' decoding guards against loops (None: off).
    copy_bias: added to the logit of every token of the row's own question, profile and history (``CopyBias``): a
    rewrite mostly copies its input, and a small model otherwise writes in a name it half remembers.
    trim_loops: a rewrite that loops ends where the loop began (qrewrite.runtime.degenerate.trim_loop; `loop_trimmed`
    says so, `raw_completion` keeps what the model wrote). dtype: `weights_dtype`; "float32" on cuda reproduces a
    float32 CPU's numbers more closely (the GPU learning run's agreement check). prefix_cache: batches
    reuse the keys and values of the tokens every prompt starts with (module docstring). batch_size 1: each row
    alone, every one timed: what a served request computes (`SERVED_BATCH_SIZE`)."""
    rewriter = LocalRewriter(model_dir, tenant, max_new_tokens=max_new_tokens, device=device, threads=threads,
                             repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                             copy_bias=copy_bias, trim_loops=trim_loops, dtype=dtype, prefix_cache=prefix_cache)
    return rewriter.rewrite(rows, batch_size=batch_size, latency_sample=latency_sample)
