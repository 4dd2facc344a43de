"""queries.jsonl (+ teacher, validated) → results/T/sft/{train,val,test}.jsonl: a grouped seeded split of every
ingested row, then the training rows filtered (validation and test stay the tenant's traffic)."""

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
    "teacher_failed": "the teacher: it gave no rewrite for the row (teacher.jsonl status error)",
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


# Why a row is no training target (a row of a train group with it is left out of train.jsonl; a row of a validation
# or test group with it stays, marked `meta.trainable: false`: those splits are the tenant's traffic)
TEACHER_FAILED = "teacher_failed"


def build_splits(cfg: dict, tenant: dict, queries: list[dict], teacher_rows: list[dict],
                 validated: list[dict], gold_rows: list[dict] | None = None) -> tuple[dict[str, list[dict]], dict]:
    """Split every ingested row, then filter the training rows only.

    The grouped, seeded split (`assign_splits`) is drawn over every row of queries.jsonl but the held-out gold set
    (`gold_rows`, qrewrite.data.gold_set: rows never trained on or measured in the splits, with every row asking
    the same question). train.jsonl keeps the rows of train groups that are training targets: the teacher
    answered, its rewrite passed the filters (`drop_reason`), holds no chat-template tokens and is no duplicate.
    val.jsonl and test.jsonl keep **every** row of their groups, whatever the teacher did: what the release chooses
    on and what eval reports are measured on the tenant's traffic, not on the part the teacher solved. Each of their
    rows says whether it is a training target (`meta.trainable`; `meta.not_trainable` the reason), and carries the
    teacher's rewrite as its assistant turn where the teacher answered (SFT's loss-validation rows are the trainable
    ones: qrewrite.training.sft.targets)."""
    from .gold_set import held_out

    gold_ids, gold_groups = held_out(gold_rows or [])
    by_t = {t["id"]: t for t in teacher_rows}
    by_v = {v["id"]: v for v in validated}
    dropped: Counter = Counter()  # rows of train groups that are no training target, by reason
    untrained: dict[str, Counter] = {"val": Counter(), "test": Counter()}  # kept, not training targets
    by_level: dict[str, Counter] = {}  # difficulty label -> rows in and why they are no training target
    rows, seen = [], set()
    for q in queries:
        level = by_level.setdefault(difficulty_label(q), Counter())
        if q["id"] in gold_ids or normalize(q["query"]) in gold_groups:  # first: never trained on, whatever else
            dropped["held_out_gold_set"] += 1
            level["held_out_gold_set"] += 1  # apart from the filter drops: a person chose these, not a threshold
            continue
        level["in"] += 1
        t, v = by_t.get(q["id"]), by_v.get(q["id"])
        ok = t is not None and t.get("status") == "ok" and v is not None
        reason = TEACHER_FAILED if not ok else drop_reason(v, tenant["thresholds"])
        if reason is None and has_control_tokens(t["rewrite"]):  # trained on, they would open chat turns
            reason = "control_tokens_in_rewrite"
        messages = rewrite_messages(tenant, q) + ([{"role": "assistant", "content": t["rewrite"]}] if ok else [])
        if reason is None:
            key = (messages[1]["content"], t["rewrite"])
            reason = "duplicate_sample" if key in seen else None
            seen.add(key)
        if reason:
            level[reason] += 1
        meta = {"tenant": tenant["name"], "query_id": q["id"], "raw_row": q["row"], "gold_doc_ids": q["gold_doc_ids"],
                "group": normalize(q["query"]), "trainable": reason is None, "not_trainable": reason}
        if ok:
            meta |= {"teacher_call_key": t["call_key"], "teacher_provider": t["provider"], "teacher_model": t["model"],
                     "prompt_hash": t["prompt_hash"], "teacher_top1": v["rewrite_rag"]["top1"],
                     "teacher_mean_top3": v["rewrite_rag"]["mean_top3"], "teacher_hits": v["rewrite_rag"]["hits"],
                     "original_top1": v["original_rag"]["top1"], "gain": v["gain"]}
        rows.append({"messages": messages, "meta": meta})
    assignment = assign_splits([r["meta"]["group"] for r in rows], cfg["split"]["seed"], cfg["split"])
    splits: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for r in rows:
        name = r["meta"]["split"] = assignment[r["meta"]["group"]]
        why = r["meta"]["not_trainable"]
        if name == "train" and why:
            dropped[why] += 1
            continue
        if why:
            untrained[name][why] += 1
        splits[name].append(r)
    stats = {"stage": "split", "in": len(queries), "out": sum(len(v) for v in splits.values()),
             "dropped": dict(sorted(dropped.items())), "splits": {s: len(v) for s, v in splits.items()},
             "with_gold": {s: sum(1 for r in v if r["meta"]["gold_doc_ids"]) for s, v in splits.items()},
             "not_trainable": {s: dict(sorted(c.items())) for s, c in untrained.items()},
             "groups": len(assignment), "by_difficulty": {k: _level_stats(c) for k, c in sorted(by_level.items())},
             "basis": "groups drawn over every ingested row (the gold set held out); train keeps the training "
                      "targets, validation and test every row of their groups"}
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
            f"tenant {name}: the split left {what} ({sizes}): {stats['in']} ingested rows, {stats['out']} kept "
            f"in {stats['groups']} question group(s). Not training targets (train groups): {reasons}. No split "
            "file was written.",
            hint=f"{hint}; then rerun (the split reruns when tenants[].thresholds change)"
            + ("" if "train" in empty else "; each split needs at least one question group (split: train / val / "
               "test fractions)"))
    filtered = sum(n for why, n in dropped.items() if why != "held_out_gold_set")
    reached = stats["splits"]["train"] + filtered  # the rows of train groups
    if reached and filtered / reached >= MOST_DROPPED:
        text = (f"tenant {name}: the split dropped {filtered} of the {reached} rows of its training groups "
                f"({filtered / reached:.0%}), leaving {stats['splits']['train']} training rows. Dropped: {reasons}. "
                f"If those rewrites are good, " + ("; ".join(filter(None, (_fix(w, th) for w in dropped))) or
                                                  "check the teacher") + ".")
        log.warning(text)
        return [{"code": "split_dropped_most_rows", "message": text}]
    return []


def _cause(why: str, thresholds: dict, top1s: list[float]) -> str:
    """The setting behind a drop reason, with its value (and, for the threshold, where the scores lie)."""
    cause = DROP_CAUSE.get(why, "see the split stage")
    if why == "top1_below_threshold" and top1s:
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
