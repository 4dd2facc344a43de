"""validated.jsonl → results/T/sft/{train,val,test}.jsonl: filter, deduplicate, grouped seeded split."""

from __future__ import annotations

import hashlib
from collections import Counter

from .prompts import has_control_tokens, rewrite_messages
from .text import normalize

SPLITS = ("train", "val", "test")


def keep_reason(row: dict, thresholds: dict) -> str | None:
    """None if the sample is kept, else the drop reason."""
    if row["rewrite_rag"]["top1"] < thresholds["top1"]:
        return "top1_below_threshold"
    if thresholds["require_gain"] and row["gain"] < 0:
        return "negative_gain"
    return None


def assign_splits(groups: list[str], seed: int, fractions: dict) -> dict[str, str]:
    """Order groups by a seeded hash and cut at the split fractions: deterministic and grouped."""
    ordered = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}\x1f{g}".encode()).hexdigest())
    n = len(ordered)
    n_train = round(n * fractions["train"])
    n_val = round(n * fractions["val"])
    out = {}
    for i, g in enumerate(ordered):
        out[g] = "train" if i < n_train else "val" if i < n_train + n_val else "test"
    return out


def build_splits(cfg: dict, tenant: dict, queries: list[dict], teacher_rows: list[dict],
                 validated: list[dict]) -> tuple[dict[str, list[dict]], dict]:
    by_q = {q["id"]: q for q in queries}
    by_t = {t["id"]: t for t in teacher_rows}
    dropped: Counter = Counter()
    kept, seen = [], set()
    for v in validated:
        reason = keep_reason(v, tenant["thresholds"])
        if reason:
            dropped[reason] += 1
            continue
        q, t = by_q[v["id"]], by_t[v["id"]]
        if has_control_tokens(t["rewrite"]):  # trained on, they would teach the student to open chat turns
            dropped["control_tokens_in_rewrite"] += 1
            continue
        messages = rewrite_messages(tenant, q) + [{"role": "assistant", "content": t["rewrite"]}]
        dedupe_key = (messages[1]["content"], t["rewrite"])
        if dedupe_key in seen:
            dropped["duplicate_sample"] += 1
            continue
        seen.add(dedupe_key)
        kept.append({"messages": messages, "meta": {
            "tenant": tenant["name"], "query_id": q["id"], "raw_row": q["row"], "gold_doc_ids": q["gold_doc_ids"],
            "teacher_call_key": t["call_key"], "teacher_provider": t["provider"], "teacher_model": t["model"],
            "prompt_hash": t["prompt_hash"], "teacher_top1": v["rewrite_rag"]["top1"],
            "teacher_mean_top3": v["rewrite_rag"]["mean_top3"], "teacher_hits": v["rewrite_rag"]["hits"],
            "original_top1": v["original_rag"]["top1"], "gain": v["gain"], "group": normalize(q["query"])}})
    assignment = assign_splits([s["meta"]["group"] for s in kept], cfg["split"]["seed"], cfg["split"])
    splits: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for s in kept:
        s["meta"]["split"] = assignment[s["meta"]["group"]]
        splits[s["meta"]["split"]].append(s)
    stats = {"stage": "split", "in": len(validated), "out": len(kept), "dropped": dict(sorted(dropped.items())),
             "splits": {s: len(v) for s, v in splits.items()}, "groups": len(assignment)}
    return splits, stats
