"""Per-stage stats → results/T/summary.json: counts in/out per stage and drops per reason."""

from __future__ import annotations

from ..errors import QrewriteError
from ..paths import STAGES


def build_summary(tenant: str, stats: dict[str, dict], reward_check: dict,
                  stats_files: dict[str, str] | None = None) -> dict:
    """``reward_check``: the reward_check stage's document; its judge and reward figures join ``signals``.
    ``stats_files``: stage → the stats file it came from, named in errors."""
    stats_files = stats_files or {}
    missing = [s for s in STAGES if s not in stats]
    if missing:
        raise ValueError(f"missing stage stats: {missing}")
    funnel = [{"stage": s, "in": stats[s]["in"], "out": stats[s]["out"],
               "dropped": sum(stats[s]["dropped"].values())} for s in STAGES]
    # Every row that entered a stage either left it or was dropped for a named reason.
    for f in funnel:
        if f["in"] != f["out"] + f["dropped"]:
            raise ValueError(f"stage {f['stage']} does not balance: {f}")
    if not stats["split"]["splits"].get("train"):  # the split stage fails first; stats of an older run do not
        raise QrewriteError(f"tenant {tenant}: the split stats report no training rows", file=stats_files.get("split"),
                            hint="rerun the split stage: it names the drop reasons and the setting to change")
    return {
        "tenant": tenant,
        "funnel": funnel,
        "dropped": {s: stats[s]["dropped"] for s in STAGES},
        # what a stage found wrong with its own output (a teacher that copies, a split that dropped most rows)
        "warnings": [{"stage": s, **w} for s in STAGES for w in stats[s].get("warnings", [])],
        "teacher": {k: stats["teacher"].get(k) for k in ("provider", "model", "cache_hits", "new_calls",
                                                          "failed_calls", "tokens", "cost_usd", "unchanged_share")},
        "retrieval": {"hit_at_1": stats["validate"]["hit_at_1"],
                      "rewrite_beats_original_share": stats["validate"]["rewrite_beats_original_share"]},
        "signals": {**(stats["validate"].get("signals") or {}), "reward_check": summary_signals(reward_check)},
        "splits": stats["split"]["splits"],
        # Share of rows the split stage dropped (thresholds.top1 and other reasons) per difficulty label: a
        # threshold that drops mostly hard rows makes the test split easier than the tenant's real traffic.
        "drops_by_difficulty": stats["split"].get("by_difficulty", {}),
        "stages": stats,
    }


def summary_signals(doc: dict) -> dict:
    """What summary.json and eval.json show of reward_check.json (qrewrite.reward.check)."""
    j = doc["judge"]
    lab = j.get("labelled") or {}
    return {"judge_auc_derived": j["derived"]["auc"],
            "judge_auc_derived_by_kind": {k: v["auc"] for k, v in j["derived"]["by_failure"].items()},
            "judge_auc_labelled": (lab.get("all") or {}).get("auc"),
            "judge_auc_labelled_heldout": (lab.get("heldout") or {}).get("auc"),
            "reward_preference": (doc["reward"] or {}).get("preference"),
            "refusal": doc["refusal"]}

