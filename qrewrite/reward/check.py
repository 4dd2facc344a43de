"""The reward checked on the tenant's own data before anything trains on it (rule ``reward_check``).

* **The judge**: its AUC on labels derived from the data half (``signals.derived_judge_labels``: good = validated
  teacher rewrites that put a gold document first, or beat the raw query without gold; bad = the raw query, and
  another row's good rewrite), overall and per kind of bad; and on the tenant's hand-labelled set where it has
  one (``tenants[].judge_labels``), overall and on the held-out half no judge rule was tuned on
  (``signals.heldout``). Every labelled rewrite is judged against the teacher's rewrite of its question, as in
  RL and eval; a labelled question the teacher never rewrote is left out and counted.
* **The whole reward**: on the same derived pairs, the share where the reward (``scorer.RewardScorer``, the
  configured weights and RAG) is higher for the good rewrite than for the bad one.

``qrewrite rl`` refuses a reward that fails either (``refusal``): a judge below ``reward.check.judge_min_auc``
(unless ``reward.weights.judge`` is 0), or a reward preferring the good rewrite in fewer than
``reward.check.min_preference`` of the pairs.
"""

from __future__ import annotations

from collections import defaultdict

from ..data.ingest import query_id
from ..signals import derived_judge_labels, heldout, judge_auc, load_judge_labels
from ..rag.cache import cached_http_rag
from ..rag.providers import make_rag
from . import reward_settings
from .scorer import RewardSample, RewardScorer

GOOD_RULE = ("a validated teacher rewrite that puts a gold document alone at rank 1 (without gold: that "
             "retrieves better than the raw query)")
BAD_KINDS = {"raw": "the raw query, where it differs from the good rewrite",
             "other_row": "another row's good rewrite (fluent, another conversation's referent)"}


async def judge_section(judge, derived: list[dict], labels_path: str | None, teacher: dict[str, str]) -> dict:
    """The judge's AUC on the derived labels and, with ``labels_path``, on the hand labels (all / held-out)."""
    d = await judge_auc(judge, derived)
    out = {"derived": {**d, "good": GOOD_RULE, "bad": BAD_KINDS}}
    if labels_path:
        rows = load_judge_labels(labels_path)
        for r in rows:
            r["reference"] = teacher.get(query_id(r["query"], r.get("profile") or "", r.get("history") or ""))
        judged = [r for r in rows if r["reference"]]
        held = [r for r in judged if heldout(r["query"])]
        out["labelled"] = {"path": labels_path, "no_reference": len(rows) - len(judged),
                           "all": await judge_auc(judge, judged) if judged else None,
                           "heldout": await judge_auc(judge, held) if held else None}
    return out


def reward_section(scorer: RewardScorer, derived: list[dict], validated: dict[str, dict]) -> dict:
    """The share of derived (good, bad) pairs of one question where the reward prefers the good rewrite."""
    samples = []
    for r in derived:
        v = validated[r["query_id"]]
        rag = v.get("rewrite_rag") or {}
        samples.append(RewardSample(
            query_id=r["query_id"], query=r["query"], rollout=r["rewrite"], teacher_rewrite=r["reference"],
            teacher_top1=rag.get("top1"), teacher_mean_top3=rag.get("mean_top3"), teacher_hits=rag.get("hits"),
            gold_doc_ids=list(v.get("gold_doc_ids") or []), profile=r["profile"], history=r["history"]))
    # every rollout judged, so the judge term is in every pair (RL samples a share: in expectation the same)
    scorer.sample_share = 1.0
    rewards = [s["score"] for s in scorer.score_batch(samples)]
    good: dict[str, float] = {}
    bad: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r, score in zip(derived, rewards):
        if r["label"] == "good":
            good[r["query_id"]] = score
        else:
            bad[r["query_id"]].append((r["failure"], score))
    kinds: dict[str, list[float]] = defaultdict(list)
    for qid, pairs in bad.items():
        for kind, score in pairs:
            kinds[kind].append(1.0 if good[qid] > score else 0.5 if good[qid] == score else 0.0)
    every = [x for xs in kinds.values() for x in xs]
    return {"preference": round(sum(every) / len(every), 4) if every else None, "pairs": len(every),
            "by_kind": {k: {"preference": round(sum(v) / len(v), 4), "pairs": len(v)} for k, v in sorted(kinds.items())},
            "mean_good": _mean(list(good.values())), "mean_bad": _mean([s for ps in bad.values() for _, s in ps]),
            "ties": "count one half"}


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def reward_check(cfg: dict, tenant: dict, queries: list[dict], teacher_rows: list[dict],
                 validated: list[dict]) -> dict:
    """reward_check.json of one tenant (see the module docstring)."""
    settings = reward_settings(cfg)
    teacher = {r["id"]: r["rewrite"] for r in teacher_rows if r.get("status") == "ok" and r.get("rewrite")}
    derived = derived_judge_labels(validated, queries)
    rag = make_rag(cfg, tenant)
    if cfg["rag"]["provider"] == "http":  # validation's cache: the good rewrites' searches are not asked again
        rag = cached_http_rag(rag, cfg, tenant)
    scorer = RewardScorer(cfg, tenant, rag=rag)
    try:
        judge = scorer.run(judge_section(scorer.judge, derived, tenant.get("judge_labels"), teacher))
        reward = reward_section(scorer, derived, {v["id"]: v for v in validated}) if derived else None
        stats = scorer.stats()
    finally:
        scorer.close()
    doc = {"tenant": tenant["name"], "judge_provider": settings["judge"]["provider"],
           "judge_model": getattr(scorer.judge, "model", None),
           "derived_labels": {"good": sum(1 for r in derived if r["label"] == "good"),
                              "bad": {k: sum(1 for r in derived if r["failure"] == k) for k in BAD_KINDS}},
           "judge": judge, "reward": reward, "weights": settings["weights"], "thresholds": settings["check"],
           "scorer": stats}
    doc["refusal"] = refusal(doc, settings)
    return doc


def refusal(doc: dict, settings: dict) -> str | None:
    """Why RL must not train on this reward (None: it may), naming the figure, the tenant and the fix."""
    th, t = settings["check"], doc["tenant"]
    judged = settings["weights"]["judge"] > 0 and th["judge_min_auc"] > 0
    if not doc["derived_labels"]["good"] and (judged or th["min_preference"] > 0):
        return (f"tenant {t}: no derived labels (no validated teacher rewrite puts a gold document first or beats "
                f"the raw query), so neither the judge nor the reward can be checked; fix the teacher or the RAG "
                f"settings first (results/{t}/summary.json), or set reward.check.judge_min_auc and "
                f"reward.check.min_preference to 0 to train on an unchecked reward")
    if not doc["derived_labels"]["good"]:
        return None
    judge_auc_ = doc["judge"]["derived"]["auc"]
    if settings["weights"]["judge"] > 0 and (judge_auc_ is None or judge_auc_ < th["judge_min_auc"]):
        return (f"tenant {t}: the judge's AUC on labels derived from the tenant's data is {judge_auc_} "
                f"(< reward.check.judge_min_auc {th['judge_min_auc']}): RL would be paid for what the judge gets "
                "wrong. Set reward.weights.judge: 0, or use a judge that passes (reward.judge.provider: openai), "
                f"and see results/{t}/reward_check.json")
    pref = (doc["reward"] or {}).get("preference")
    if pref is None or pref < th["min_preference"]:
        return (f"tenant {t}: the reward prefers the good rewrite in {pref} of the derived pairs "
                f"(< reward.check.min_preference {th['min_preference']}): change reward.weights (e.g. raise rank) "
                f"and see results/{t}/reward_check.json")
    return None
