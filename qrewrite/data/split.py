"""validated.jsonl → results/T/sft/{train,val,test}.jsonl: filter, deduplicate, grouped seeded split."""

from __future__ import annotations

import hashlib
from collections import Counter

from ..prompts import has_control_tokens, rewrite_messages
from ..text import normalize

SPLITS = ("train", "val", "test")


def drop_reason(row: dict, thresholds: dict) -> str | None:
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
                 validated: list[dict], gold_rows: list[dict] | None = None) -> tuple[dict[str, list[dict]], dict]:
    """`gold_rows` (qrewrite.data.gold_set): rows held out of every split, with every row asking the same question."""
    from .gold_set import held_out

    gold_ids, gold_groups = held_out(gold_rows or [])
    queries_by_id = {row["id"]: row for row in queries}
    by_t = {t["id"]: t for t in teacher_rows}
    dropped: Counter = Counter()
    by_level: dict[str, Counter] = {}  # difficulty label -> counts of rows in and dropped per reason
    kept, seen = [], set()
    for v in validated:
        query_row = queries_by_id[v["id"]]
        level = by_level.setdefault(difficulty_label(query_row), Counter())
        if query_row["id"] in gold_ids or normalize(query_row["query"]) in gold_groups:  # first: never trained on, whatever else
            dropped["held_out_gold_set"] += 1
            level["held_out_gold_set"] += 1  # apart from the filter drops: a person chose these, not a threshold
            continue
        level["in"] += 1

        def drop(why: str) -> None:
            dropped[why] += 1
            level[why] += 1

        reason = drop_reason(v, tenant["thresholds"])
        if reason:
            drop(reason)
            continue
        t = by_t[v["id"]]
        if has_control_tokens(t["rewrite"]):  # trained on, they would teach the student to open chat turns
            drop("control_tokens_in_rewrite")
            continue
        messages = rewrite_messages(tenant, query_row) + [{"role": "assistant", "content": t["rewrite"]}]
        dedupe_key = (messages[1]["content"], t["rewrite"])
        if dedupe_key in seen:
            drop("duplicate_sample")
            continue
        seen.add(dedupe_key)
        kept.append({"messages": messages, "meta": {
            "tenant": tenant["name"], "query_id": query_row["id"], "raw_row": query_row["row"], "gold_doc_ids": query_row["gold_doc_ids"],
            "teacher_call_key": t["call_key"], "teacher_provider": t["provider"], "teacher_model": t["model"],
            "prompt_hash": t["prompt_hash"], "teacher_top1": v["rewrite_rag"]["top1"],
            "teacher_mean_top3": v["rewrite_rag"]["mean_top3"], "teacher_hits": v["rewrite_rag"]["hits"],
            "original_top1": v["original_rag"]["top1"], "gain": v["gain"], "group": normalize(query_row["query"])}})
    assignment = assign_splits([s["meta"]["group"] for s in kept], cfg["split"]["seed"], cfg["split"])
    splits: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for s in kept:
        s["meta"]["split"] = assignment[s["meta"]["group"]]
        splits[s["meta"]["split"]].append(s)
    stats = {"stage": "split", "in": len(validated), "out": len(kept), "dropped": dict(sorted(dropped.items())),
             "splits": {s: len(v) for s, v in splits.items()}, "groups": len(assignment),
             "by_difficulty": {k: _level_stats(c) for k, c in sorted(by_level.items())}}
    return splits, stats


def difficulty_label(query_row: dict) -> str:
    """The row's difficulty (Excel column tenants[].columns.difficulty); "all" when the tenant has none."""
    if "difficulty" not in query_row:
        return "all"
    return query_row["difficulty"] or "(blank)"


def _level_stats(c: Counter) -> dict:
    """Rows of one difficulty: how many came in, how many the top-1 threshold dropped, and the shares (over the
    rows that reached the filters: gold-set rows held out before them are counted apart)."""
    n, below = c["in"], c["top1_below_threshold"]
    dropped = sum(v for k, v in c.items() if k not in ("in", "held_out_gold_set"))
    return {"in": n, "top1_below_threshold": below, "top1_drop_share": round(below / n, 4) if n else 0.0,
            "dropped": dropped, "drop_share": round(dropped / n, 4) if n else 0.0,
            **({"held_out_gold_set": c["held_out_gold_set"]} if c["held_out_gold_set"] else {})}
