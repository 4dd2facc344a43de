"""Rewrites from a local Hugging Face model: greedy decoding with plain transformers (ms-swift env).

The prompt is exactly what SFT trained on: `qrewrite.prompts.rewrite_messages` rendered with the
tokenizer's chat template plus the generation prompt. The completion is cleaned with the RL reward's
`clean_rollout` (drops end-of-turn and other template tokens), so eval scores what RL optimised.

Latency is the wall time of the `generate` call a query was in: with `batch_size: 1` (the default) it is
the single-request latency a rewriting service would see; with larger batches every query of a batch
waits for the whole batch. `compute_s` is the query's share of the batch time and is what local cost is
charged on. The model load and one warm-up generation are not timed (a server pays them once).
"""

from __future__ import annotations

import logging
import time

from ..errors import QrewriteError
from ..prompts import rewrite_messages

log = logging.getLogger(__name__)


def generate_rewrites(model_dir: str, tenant: dict, rows: list[dict], *, batch_size: int, max_new_tokens: int,
                      threads: int | None, device: str) -> tuple[list[dict], dict]:
    """([{query_id, rewrite, raw_completion, latency_s, compute_s, new_tokens}], info) for `rows`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..reward.scorer import clean_rollout

    if threads:
        torch.set_num_threads(int(threads))
    if device == "cuda" and not torch.cuda.is_available():
        raise QrewriteError("eval.generation.device is cuda but no GPU is visible",
                            hint="set eval.generation.device: cpu, or run on a GPU node")
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16 if device == "cuda" else torch.float32).to(device)
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

    def prompt(row: dict) -> str:
        return tok.apply_chat_template(rewrite_messages(tenant, row), add_generation_prompt=True, tokenize=False)

    def run(batch: list[dict]):
        enc = tok([prompt(r) for r in batch], return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                 temperature=None, top_p=None, top_k=None)
        return out[:, enc["input_ids"].shape[1]:]

    if rows:
        run(rows[:1])  # warm-up, untimed
    results = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        start = time.perf_counter()
        new = run(batch)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        for row, ids in zip(batch, new):
            raw = tok.decode(ids, skip_special_tokens=False)
            n_new = int((ids != tok.pad_token_id).sum())
            # a multi-byte character cut by max_new_tokens decodes to U+FFFD: residue, not text
            results.append({"query_id": row["query_id"], "rewrite": clean_rollout(raw).rstrip("\ufffd").strip(),
                            "raw_completion": raw,
                            "latency_s": round(wall, 6), "compute_s": round(wall / len(batch), 6),
                            "new_tokens": n_new})
        log.info("generated %d/%d", len(results), len(rows))
    info = {"device": device, "threads": torch.get_num_threads(), "batch_size": batch_size,
            "max_new_tokens": max_new_tokens, "dtype": str(model.dtype), "torch": torch.__version__}
    return results, info
