"""The judge's training files from its items: chat rows for LoRA SFT (prompt → reason + score), prompt rows with
the label for GRPO, both from the train items only; the SFT validation rows are a tenth of the train questions
(by a hash of the question, so a question's candidates stay together)."""

from __future__ import annotations

import hashlib

from ..io_utils import write_jsonl
from ..text import normalize
from ..reward.judge_prompt import messages, reply


def _val(query: str) -> bool:
    return hashlib.sha256(("judge-val\x1f" + normalize(query)).encode("utf-8")).digest()[0] < 26  # ~10 %


def _mixed(train: list[dict], student_share: float | None) -> list[dict]:
    """The train items with the student's sampled rewrites at least `student_share` of them: the other kinds
    (teacher, raw, other_row, red_team) cut to a deterministic subset by item id, never repeated. The student's
    rewrites are what the RL reward judges, and the fewest (fivedoctors, study C: 78 of 346 SFT rows). At 0.5 it
    did not close the gap to the rule judge there (study E, docs/signals.md), so it is off by default. None, or no
    student item: all items."""
    student = [it for it in train if it["kind"] == "student"]
    if student_share is None or not student:
        return train
    others = [it for it in train if it["kind"] != "student"]
    keep = {it["item_id"] for it in sorted(others, key=lambda it: it["item_id"])
            [:int(len(student) * (1 - student_share) / student_share)]} if student_share < 1 else set()
    return [it for it in train if it["kind"] == "student" or it["item_id"] in keep]


def _sft_split(items: list[dict], student_share: float | None = None) -> tuple[list[dict], list[dict]]:
    """Train items (`_mixed`) into SFT train / validation (by question); a tiny tenant still gets one validation
    question."""
    train = _mixed([it for it in items if it["split"] == "train"], student_share)
    val = [it for it in train if _val(it["query"])]
    if not val and len(train) > 1:
        q = normalize(train[-1]["query"])
        val = [it for it in train if normalize(it["query"]) == q]
    val_q = {normalize(it["query"]) for it in val}
    return [it for it in train if normalize(it["query"]) not in val_q], val


def _chat(it: dict) -> dict:
    return {"messages": [*messages(it), {"role": "assistant", "content": reply(it["reason"], it["score"])}]}


def sft_rows(items: list[dict], student_share: float | None = None) -> tuple[list[dict], list[dict]]:
    train, val = _sft_split(items, student_share)
    return [_chat(it) for it in train], [_chat(it) for it in val]


def _balanced(items: list[dict]) -> list[dict]:
    """The minority verdict repeated (whole copies first, then a deterministic part by item id) until both
    verdicts are as many: a GRPO step sees a couple of prompts, and on a set mostly of one verdict the judge is
    rewarded for saying it always (a GRPO judge of the first study said "good" to every student rewrite)."""
    good = [it for it in items if it["label"] == "good"]
    bad = [it for it in items if it["label"] == "bad"]
    if not good or not bad:
        return items
    few, many = sorted((good, bad), key=len)
    extra = few * (len(many) // len(few) - 1) + sorted(few, key=lambda it: it["item_id"])[:len(many) % len(few)]
    return items + extra


def grpo_rows(items: list[dict], student_share: float | None = None) -> list[dict]:
    """Prompt rows of the SFT train questions (the SFT validation questions stay out), both verdicts equally
    many (`_balanced`); `label` and `item_id` reach the reward functions as columns
    (qrewrite.judge.swift_rewards)."""
    train, _ = _sft_split(items, student_share)
    return [{"messages": messages(it), "label": it["label"], "item_id": it["item_id"]} for it in _balanced(train)]


def write(items: list[dict], out: dict[str, str], *, student_share: float | None = None) -> dict:
    train, val = sft_rows(items, student_share)
    grpo = grpo_rows(items, student_share)
    write_jsonl(out["items"], items)
    write_jsonl(out["sft_train"], train)
    write_jsonl(out["sft_val"], val)
    write_jsonl(out["grpo_train"], grpo)
    return {"sft_train": len(train), "sft_val": len(val), "grpo_train": len(grpo)}


def sample_rewrites(model_dir: str, tenant: dict, rows: list[dict], *, n: int, threads: int | None,
                    seed: int = 0, max_new_tokens: int = 40, batch_size: int = 8, progress: bool = True) -> list[dict]:
    """`n` sampled rewrites (temperature 1) of each row by a local model: the student's own kinds of mistakes,
    for the judge to learn; [{query_id, rewrite}]."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..runtime.generate import clean_completion
    from ..prompts import rewrite_messages

    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    for i in tqdm(range(0, len(rows), batch_size), desc=f"student samples ({n} a question)", unit="batch",
                  disable=not progress, mininterval=0.5):
        batch = rows[i:i + batch_size]
        prompts = [tok.apply_chat_template(rewrite_messages(tenant, r), add_generation_prompt=True, tokenize=False)
                   for r in batch]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 num_return_sequences=n, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        for j, ids in enumerate(new):
            out.append({"query_id": batch[j // n]["query_id"],
                        "rewrite": clean_completion(tok.decode(ids, skip_special_tokens=False))})
    return out
