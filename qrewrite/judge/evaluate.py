"""The distilled judge measured like the study, plus what this project knows (reports/T/judge.json).

Judges: the base model, the SFT judge, the GRPO judge (all with the same prompt: ``ModelJudge``), the rule judge,
and the API judge where ``reward.judge.provider`` is openai; with ``reward.judge.model.rule_weight`` also the SFT
and GRPO judges blended with the rule judge at that weight (``sft+rule``, ``grpo+rule``). On three labelled sets, none of whose questions the
judge trained on:

* ``heldout``: the held-out judgement items (their questions: the eval's test questions and the held-out half);
  verdict accuracy (score >= GOOD_AT vs the label; a reply that does not parse is a wrong verdict), format
  validity, AUC;
* ``hand``: the tenant's hand labels (judge_labels), the held-out half (``signals.heldout``): AUC;
* ``student``: the SFT student's own test rewrites (greedy), good when the tenant's RAG puts a gold document alone at
  rank 1;
* ``rollouts``: what the RL reward judges: the student's *sampled* rewrites (temperature 1; rollouts are sampled at
  0.9-1) of its own train questions in the held-out half (``signals.heldout``), which the judge never trained on,
  labelled the same way: RL's rollouts are of the student's train questions too. Sampling makes more bad rewrites
  than greedy decoding, so this set has more of the good-bad pairs an AUC counts.

AUC: P(a good candidate outscores a bad one), ties one half, a failed judgement the lowest score; 95 % intervals by
bootstrap over the candidates. Each judge's AUC minus the rule judge's on the same candidates (``auc_minus_rule``)
has a paired interval (both resampled on the same candidates, so the variation they share cancels): the issue's
bar is that comparison. Cost per 1,000 judgements: the local judges' CPU time at eval.gpu_hour_usd; the API
judge's list price for its prompt and a 40-token reply (tokens counted with the base model's tokenizer: an
estimate, said so).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ..reward.judge_blend import blend
from ..tasks import gather_with_progress
from ..reward.judge_prompt import verdict

SETS = ("heldout", "hand", "student", "rollouts")  # eval_sets' sets, in the order judge-eval logs them


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def auc(scores: np.ndarray, good: np.ndarray) -> float | None:
    n_good, n_bad = int(good.sum()), int((~good).sum())
    if not n_good or not n_bad:
        return None
    r = _ranks(scores)
    return float((r[good].sum() - n_good * (n_good + 1) / 2) / (n_good * n_bad))


def _bootstrap(stat, n: int, *, samples: int, seed: int, confidence: float):
    """stat(indices) on all n candidates, its interval over `samples` resamples of them (a resample where it is
    undefined, None, is dropped), and the resampled values: (point, low, high, values)."""
    point = stat(np.arange(n))
    rng = np.random.default_rng(seed)
    boots = np.array([v for _ in range(samples) if (v := stat(rng.integers(0, n, n))) is not None])
    lo, hi = (np.quantile(boots, [(1 - confidence) / 2, (1 + confidence) / 2]) if len(boots) else (None, None))
    return point, lo, hi, boots


def eval_sets(items: list[dict], hand: list[dict], student_test: list[dict], *, cap: int) -> dict[str, list[dict]]:
    """The labelled sets (module doc) of judge-data's items, the held-out hand labels and the student's labelled
    test rewrites, each at most `cap` items: a deterministic subset by item id where judge-data made more."""
    def first(rows):
        rows = list(rows)
        return rows if len(rows) <= cap else sorted(rows, key=lambda r: r["item_id"])[:cap]

    held = [r for r in items if r["split"] == "heldout"]
    return {"heldout": first(held), "hand": hand[:cap], "student": student_test[:cap],
            "rollouts": first(r for r in held if r["kind"] == "student")}


def _rounded(x) -> float | None:
    return None if x is None else round(float(x), 4)


def with_ci(values: list[float], labels: list[str], *, samples: int, seed: int, confidence: float,
            stat: str) -> dict:
    """The statistic with a bootstrap interval over the candidates: 'auc' of the scores `values`, or 'accuracy',
    the mean of `values` (1 for a right verdict, 0 for a wrong or failed one)."""
    s, g = np.asarray(values, float), np.asarray([lab == "good" for lab in labels])

    def f(i):
        return auc(s[i], g[i]) if stat == "auc" else (float(np.mean(s[i])) if len(i) else None)

    point, lo, hi, _ = _bootstrap(f, len(s), samples=samples, seed=seed, confidence=confidence)
    return {"value": _rounded(point), "ci_low": _rounded(lo), "ci_high": _rounded(hi), "n": len(s),
            "n_good": int(g.sum())}


def paired_delta(a: list[float], b: list[float], labels: list[str], *, samples: int, seed: int,
                 confidence: float) -> dict:
    """AUC(a) - AUC(b) of two judges' scores of the same candidates, with a bootstrap interval that resamples the
    candidates once for both (paired: narrower than either judge's own interval when the two rank alike), and the
    share of resamples where a is at least b."""
    sa, sb, g = np.asarray(a, float), np.asarray(b, float), np.asarray([lab == "good" for lab in labels])

    def d(i):
        x, y = auc(sa[i], g[i]), auc(sb[i], g[i])
        return None if x is None or y is None else x - y

    point, lo, hi, boots = _bootstrap(d, len(g), samples=samples, seed=seed, confidence=confidence)
    if point is None or not len(boots):
        return {"value": None, "ci_low": None, "ci_high": None, "share_at_least": None, "n": len(g)}
    return {"value": _rounded(point), "ci_low": _rounded(lo), "ci_high": _rounded(hi),
            "share_at_least": _rounded(np.mean(boots >= 0)), "n": len(g)}


def scored(scores: list[float | None]) -> list[float]:
    """The scores AUC ranks: a failed judgement (None) the lowest score, 0."""
    return [v if v is not None else 0.0 for v in scores]


async def judge_all(judge, rows: list[dict], *, desc: str = "judge", progress: bool = True
                    ) -> tuple[list[float | None], float]:
    """Scores (None: failed) of `rows` ({query, profile, history, reference, candidate}) and the wall time, with a
    progress bar (a local judge takes seconds per item on a CPU: a set is minutes)."""
    async def one(i: int, r: dict):
        return i, await judge.judge(r["query"], r.get("profile") or "", r.get("history") or "", r["candidate"],
                                    r.get("reference"))

    t0 = time.perf_counter()
    done = await gather_with_progress((one(i, r) for i, r in enumerate(rows)), desc=desc, progress=progress)
    return [v.score for _, v in sorted(done, key=lambda x: x[0])], time.perf_counter() - t0


def measure(scores: list[float | None], rows: list[dict], bkw: dict, *, accuracy: bool) -> dict:
    labels = [r["label"] for r in rows]
    out = {"auc": with_ci(scored(scores), labels, stat="auc", **bkw),
           "format_valid": round(sum(s is not None for s in scores) / len(scores), 4) if scores else None}
    if accuracy:
        right = [1.0 if s is not None and verdict(s) == lab else 0.0 for s, lab in zip(scores, labels)]
        out["accuracy"] = with_ci(right, labels, stat="accuracy", **bkw)
        out["verdicts"] = {"good": sum(verdict(s) == "good" for s in scores if s is not None),
                           "bad": sum(verdict(s) == "bad" for s in scores if s is not None),
                           "failed": sum(s is None for s in scores)}
    return out


def evaluate_judges(judges: dict, sets: dict[str, list[dict]], bkw: dict, *, gpu_hour_usd: float,
                    api_cost_per_1k: float | None, progress: bool = True,
                    blends: dict[str, tuple[str, float]] | None = None) -> dict:
    """{judge name: {set: metrics, seconds_per_judgement, cost_per_1k_usd}} for `judges` = {name: judge}. Beside the
    rule judge, each other judge's sets also carry ``auc_minus_rule`` (paired_delta): the issue's bar compares them
    on the same candidates. `blends` = {name: (model judge's name, rule weight)}: that judge's scores blended with
    the rule judge's (``judge_blend.blend``, what reward.judge.model.rule_weight does in the reward), measured from
    the scores already made (no judgement repeated), costing both judges' time."""
    out, ranked, raw, walls = {}, {}, {}, {}
    for name, judge in judges.items():
        res, n, wall = {}, 0, 0.0
        for set_name, rows in sets.items():
            if not rows:
                continue
            scores, secs = asyncio.run(judge_all(judge, rows, desc=f"{name} judge, {set_name} set",
                                                 progress=progress))
            res[set_name] = measure(scores, rows, bkw, accuracy=set_name == "heldout")
            ranked[name, set_name], raw[name, set_name] = scored(scores), scores
            n, wall = n + len(rows), wall + secs
        walls[name] = (n, wall)
        local = name != "api"
        per = wall / n if n else None
        res["seconds_per_judgement"] = round(per, 4) if per is not None else None
        res["cost_per_1k_usd"] = (round(per * 1000 / 3600 * gpu_hour_usd, 4) if local and per is not None
                                  else api_cost_per_1k)
        res["stats"] = judge.stats() if hasattr(judge, "stats") else {}
        out[name] = res
    for name, (of, weight) in (blends or {}).items():
        res = {}
        for set_name, rows in sets.items():
            if (of, set_name) in raw and ("rule", set_name) in raw:
                scores = [blend(m, r, weight) for m, r in zip(raw[of, set_name], raw["rule", set_name])]
                res[set_name] = measure(scores, rows, bkw, accuracy=set_name == "heldout")
                ranked[name, set_name] = scored(scores)
        n = walls[of][0]
        per = (walls[of][1] + walls["rule"][1]) / n if n else None
        res["seconds_per_judgement"] = round(per, 4) if per is not None else None
        res["cost_per_1k_usd"] = round(per * 1000 / 3600 * gpu_hour_usd, 4) if per is not None else None
        res["rule_weight"] = weight
        out[name] = res
    for (name, set_name), scores in ranked.items():
        if name != "rule" and ("rule", set_name) in ranked:
            out[name][set_name]["auc_minus_rule"] = paired_delta(
                scores, ranked["rule", set_name], [r["label"] for r in sets[set_name]], **bkw)
    return out
