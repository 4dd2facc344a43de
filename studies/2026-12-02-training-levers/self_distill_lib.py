"""Retrieval-guided self-distillation (a lever tried for a student that trails query + history; ReST / STaR,
ConvSearch-R1's warm-up): the SFT student samples k rewrites of every training question, the tenant's retriever
keeps those that put a gold document first, and the student trains again on them beside the teacher's rows. What it
adds over SFT is the retriever's say: a kept sample is one of the student's own phrasings that BM25 (or the RAG
service) ranks gold first with.

Three small steps, each its own function: `sample_rewrites` (the ms-swift env: transformers), `keep` (pure), and
`distilled_rows` (pure). self_distill.py runs them with the tenant's retriever and a second SFT between.
"""

from __future__ import annotations

import logging

from qrewrite.prompts import rewrite_messages

log = logging.getLogger(__name__)


def sample_rewrites(model_dir: str, tenant: dict, rows: list[dict], *, k: int, temperature: float, top_p: float,
                    max_new_tokens: int, batch_size: int, threads: int | None, seed: int) -> dict[str, list[str]]:
    """query id → k sampled rewrites of the row (the SFT prompt, cleaned as the eval cleans a completion)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qrewrite.runtime.generate import clean_completion

    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    out: dict[str, list[str]] = {}
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        prompts = [tok.apply_chat_template(rewrite_messages(tenant, r), add_generation_prompt=True, tokenize=False)
                   for r in batch]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=None,
                                 num_return_sequences=k, max_new_tokens=max_new_tokens,
                                 pad_token_id=tok.pad_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        for j, r in enumerate(batch):  # generate returns each prompt's k sequences next to each other
            out[r["query_id"]] = [clean_completion(tok.decode(ids, skip_special_tokens=False))
                                  for ids in new[j * k:(j + 1) * k]]
        log.info("sampled %d/%d rows (k=%d)", min(i + batch_size, len(rows)), len(rows), k)
    return out


def keep(teacher: dict[str, str], samples: dict[str, list[str]], hits: dict[str, dict[str, float]],
         per_row: int) -> dict[str, list[str]]:
    """query id → the samples to train on: those that put a gold document first alone (tie-aware Hit@1 = 1: a
    tie with a duplicate of gold is not a phrasing the retriever prefers), other than the teacher's rewrite and
    each other (a copy of a row teaches nothing new), at most `per_row`, in sampling order.
    `hits[qid][text]`: the tie-aware Hit@1 of a sampled text."""
    out = {}
    for qid, texts in samples.items():
        seen, kept = {teacher.get(qid, "").strip()}, []
        for t in texts:
            t = t.strip()
            if t and t not in seen and (hits[qid].get(t) or 0.0) >= 1.0:
                kept.append(t)
            seen.add(t)
            if len(kept) == per_row:
                break
        if kept:
            out[qid] = kept
    return out


def distilled_rows(train: list[dict], kept: dict[str, list[str]]) -> list[dict]:
    """The SFT split's rows (the teacher's, unchanged) followed by one row per kept sample: the same prompt, the
    sample as the assistant's answer, meta.target = "self_distill" (the teacher's rows say nothing: they are as
    the split wrote them)."""
    extra = []
    for row in train:
        qid = (row.get("meta") or {}).get("query_id")
        for text in kept.get(qid, []):
            msgs = [dict(m) for m in row["messages"]]
            if msgs[-1]["role"] != "assistant":
                raise ValueError(f"SFT row of query {qid} does not end with the assistant's answer")
            msgs[-1]["content"] = text
            extra.append({**row, "messages": msgs, "meta": {**row["meta"], "target": "self_distill"}})
    return list(train) + extra
