"""validated.jsonl → results/T/sft/{train,val,test}.jsonl: filter, deduplicate, grouped seeded split."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

from ..errors import QrewriteError
from ..metrics import gold_ranking
from ..prompts import has_control_tokens, rewrite_messages
from ..text import normalize

log = logging.getLogger("qrewrite.split")

SPLITS = ("train", "val", "test")

# What to change (or check) for each drop reason: named in the empty-split error and the most-dropped warning.
DROP_CAUSE = {
    "top1_below_threshold": "setting tenants[].thresholds.top1",
    "gold_not_retrieved": "the teacher or the RAG service: the rewrite retrieves none of the query's gold documents",
    "negative_gain": "setting tenants[].thresholds.require_gain",
    "held_out_gold_set": "setting tenants[].gold_set",
    "control_tokens_in_rewrite": "the teacher: its rewrites hold chat-template tokens",
    "duplicate_sample": "the Excel: the same question, context and rewrite more than once",
}
# The split warns when its filters drop at least this share of the rows that reach them: the train split is then
# small because of a setting, not because the tenant has few questions.
MOST_DROPPED = 0.5


def drop_reason(row: dict, thresholds: dict) -> str | None:
    """None if the sample is kept, else the drop reason.

    A query with gold documents is validated by them, the direct evidence: its rewrite must retrieve a gold document
    (`gold_not_retrieved`) and, with `require_gain`, rank it no lower than the raw query does (tie-aware reciprocal
    rank; `negative_gain`). The top-1 threshold, a stand-in for "the retriever found the right document", is for
    queries without gold: on a tenant whose KB holds near-paraphrases the right document is often found with a low
    top-1 score, and the threshold dropped a third of such a tenant's correct rewrites (CQR)."""
    gold = row.get("gold_doc_ids")
    if gold:
        rewritten = gold_ranking(row["rewrite_rag"]["hits"], gold)
        if rewritten["gold_rank"] is None:
            return "gold_not_retrieved"
        if thresholds["require_gain"] and rewritten["rr"] < gold_ranking(row["original_rag"]["hits"], gold)["rr"]:
            return "negative_gain"
        return None
    if row["rewrite_rag"]["top1"] < thresholds["top1"]:
        return "top1_below_threshold"
    if thresholds["require_gain"] and row["gain"] < 0:
        return "negative_gain"
    return None


def assign_splits(groups: list[str], seed: int, fractions: dict) -> dict[str, str]:
    """Order groups by a seeded hash and cut at the split fractions: deterministic and grouped. `val_min`
    (groups) is a floor under validation taken from train, never from test: the release chooses on validation,
    and 20 rows cannot tell two candidates apart (one row is 0.05 Hit@1). Train keeps at least half its share."""
    ordered = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}\x1f{g}".encode()).hexdigest())
    n = len(ordered)
    n_train = round(n * fractions["train"])
    n_val = round(n * fractions["val"])
    floor = min(int(fractions.get("val_min") or 0), n_val + n_train // 2)
    if n_val < floor:
        n_train, n_val = n_train - (floor - n_val), floor
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


def check_splits(stats: dict, tenant: dict, validated: list[dict]) -> list[dict]:
    """Raise when a split would be empty: SFT trains on train and validates on val, eval measures on test, and
    none of them can run on nothing (nor should the data half look done). Return the warnings: the filters
    dropped most rows. `validated`: the split's input rows, to say where the top-1 threshold cuts."""
    name, th, dropped = tenant["name"], tenant["thresholds"], stats["dropped"]
    top1s = [v["rewrite_rag"]["top1"] for v in validated]
    reasons = "; ".join(f"{why} {n} ({_cause(why, th, top1s)})" for why, n in
                        sorted(dropped.items(), key=lambda kv: -kv[1])) or "none"
    empty = [s for s in SPLITS if not stats["splits"][s]]
    if empty:
        sizes = " / ".join(f"{s} {stats['splits'][s]}" for s in SPLITS)
        what = "no training rows" if "train" in empty else f"an empty {' and '.join(empty)} split"
        hint = ("; ".join(_fix(why, th) for why in sorted(dropped, key=lambda w: -dropped[w]) if _fix(why, th))
                or "add rows to the tenant's Excel")
        raise QrewriteError(
            f"tenant {name}: the split left {what} ({sizes}): {stats['in']} validated rows, {stats['out']} kept "
            f"in {stats['groups']} question group(s). Dropped: {reasons}. No split file was written.",
            hint=f"{hint}; then rerun (the split reruns when tenants[].thresholds change)"
            + ("" if "train" in empty else "; each split needs at least one question group (split: train / val / "
               "test fractions)"))
    reached = stats["in"] - dropped.get("held_out_gold_set", 0)
    filtered = sum(n for why, n in dropped.items() if why != "held_out_gold_set")
    if reached and filtered / reached >= MOST_DROPPED:
        text = (f"tenant {name}: the split dropped {filtered} of the {reached} rows that reached its filters "
                f"({filtered / reached:.0%}), leaving {stats['splits']['train']} training rows. Dropped: {reasons}. "
                f"If those rewrites are good, " + ("; ".join(filter(None, (_fix(w, th) for w in dropped))) or
                                                  "check the teacher") + ".")
        log.warning(text)
        return [{"code": "split_dropped_most_rows", "message": text}]
    return []


def _cause(why: str, thresholds: dict, top1s: list[float]) -> str:
    """The setting behind a drop reason, with its value (and, for the threshold, where the scores lie)."""
    cause = DROP_CAUSE.get(why, "see the split stage")
    if why == "top1_below_threshold":
        ranked = sorted(top1s)
        at = lambda q: ranked[min(len(ranked) - 1, int(q * len(ranked)))]  # noqa: E731
        cause += (f" = {thresholds['top1']}; the rewrites' top-1 scores: median {at(0.5):.3g}, 90th percentile "
                  f"{at(0.9):.3g}, max {ranked[-1]:.3g}")
    elif why == "negative_gain":
        cause += f" = {str(thresholds['require_gain']).lower()}"
    return cause


def _fix(why: str, thresholds: dict) -> str | None:
    """What to change for a drop reason that a setting causes, else None."""
    if why == "top1_below_threshold":
        return (f"lower tenants[].thresholds.top1 (now {thresholds['top1']}; with the local relevance score the top "
                f"hit is the right document with probability ~top1, with rag.provider http the scale is your "
                f"service's reranker score)")
    if why == "negative_gain":
        return "set tenants[].thresholds.require_gain: false (keeps rewrites that retrieve worse than the raw query)"
    return None


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
