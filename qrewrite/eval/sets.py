"""eval.json `gold_set` and `red_team`: every candidate on the rows a person checked and on adversarial rows.

* gold set: the split's metrics (Hit@1/5, MRR, quality, judge; scored by `score._score_candidate` like the
  test split) plus how close each rewrite is to the checked one (character F1, exact match); the checked
  rewrite itself is scored too (`checked`), the reference a candidate is compared with.
* red team: the pure checks of `qrewrite.data.red_team` on each rewrite: pass rate per candidate, overall and per
  attack type, and the failed checks of each failing row.
"""

from __future__ import annotations

from ..data.gold_set import char_f1, exact_match
from ..data.red_team import ATTACKS, check_rewrite, failed_checks, passed
from .. import stats

GOLD_METRICS = ("hit_at_1", "hit_at_5", "mrr", "quality", "judge", "char_f1", "exact_match")
CHECKED = "checked"  # the checked rewrite, scored as if it were a candidate


def _text(rw: dict) -> str:
    return (rw.get("rewrite") or "").strip() if rw.get("status") == "ok" else ""


def gold_section(rows: list[dict], scored: dict[str, list[dict]], bkw: dict) -> dict:
    """`scored`: {candidate (and CHECKED): per-row scores of `rows`, from score._score_candidate}."""
    out = {}
    for name, per in scored.items():
        for s, row in zip(per, rows):
            s["char_f1"] = round(char_f1(s["rewrite"], row["checked_rewrite"]), 6)
            s["exact_match"] = 1.0 if exact_match(s["rewrite"], row["checked_rewrite"]) else 0.0
        out[name] = {m: stats.mean_ci([s[m] for s in per], **bkw) for m in GOLD_METRICS}
    return {"n": len(rows), "n_with_gold": sum(1 for r in rows if r["gold_doc_ids"]),
            "reference": CHECKED, "candidates": out,
            "rows": [{"query_id": r["query_id"], "query": r["query"], "checked_rewrite": r["checked_rewrite"],
                      **{n: {"rewrite": scored[n][i]["rewrite"], "hit_at_1": scored[n][i]["hit_at_1"],
                             "char_f1": scored[n][i]["char_f1"]} for n in scored}} for i, r in enumerate(rows)]}


def red_team_section(rows: list[dict], rewrites: dict[str, dict[str, dict]]) -> dict:
    """`rewrites`: {candidate: {query_id: rewrite row}}. Pass = every check of the row passes."""
    out = {}
    for name, by_id in rewrites.items():
        results = [check_rewrite(_text(by_id[r["query_id"]]), r["expect"]) for r in rows]
        ok = [passed(x) for x in results]
        per_attack = {}
        for attack in ATTACKS:
            idx = [i for i, r in enumerate(rows) if r["attack"] == attack]
            if idx:
                per_attack[attack] = {"n": len(idx), "passed": sum(ok[i] for i in idx),
                                      "pass_rate": round(sum(ok[i] for i in idx) / len(idx), 6)}
        out[name] = {"n": len(rows), "passed": sum(ok), "pass_rate": round(sum(ok) / len(rows), 6),
                     "by_attack": per_attack,
                     "failures": [{"id": r["query_id"], "attack": r["attack"], "failed": failed_checks(x),
                                   "rewrite": _text(by_id[r["query_id"]])}
                                  for r, x, p in zip(rows, results, ok) if not p]}
    return {"n": len(rows), "use": "the eval half of the red-team set (the other half is in RL prompts)",
            "candidates": out}
