"""The release rule, pure: which candidate a tenant gets, from validation scores alone.

Candidates come cheapest first (a rule, then the SFT student, then RL; within a model, its decoding levers in
config order). A candidate is released only when its validation Hit@1 beats that of every cheaper candidate by
more than `margin`; a tie keeps the cheaper. Without a row that has gold documents nothing can be shown to beat
the cheapest, so the cheapest is released and the decision says why.
"""

from __future__ import annotations

RULE = ("the highest validation tie-aware Hit@1; a costlier candidate must beat every cheaper one by more than "
        "release.margin ({margin:g}); a tie goes to the cheaper (candidates cheapest first: {order})")


def choose(figures: list[dict], margin: float) -> dict:
    """{index, name, why, rule} of the candidate to release. `figures`: cheapest first, each {name, mean, n}
    (mean None or n 0: no validation row with gold)."""
    if not figures:
        raise ValueError("no release candidates")
    rule = RULE.format(margin=margin, order=" < ".join(f["name"] for f in figures))
    if not any(f.get("n") for f in figures):
        return {"index": 0, "name": figures[0]["name"], "rule": rule,
                "why": "no validation row has gold documents: nothing can be shown to beat the cheapest candidate"}
    best = 0
    for i in range(1, len(figures)):
        mean = figures[i]["mean"]
        cheaper = max(f["mean"] for f in figures[:i] if f["mean"] is not None)
        if mean is not None and mean > cheaper + margin + 1e-12:
            best = i
    won = figures[best]
    if best == 0:
        why = (f"no costlier candidate beat {won['name']} ({won['mean']:.4f}) on validation by more than "
               f"{margin:g}")
    else:
        beaten = max(f["mean"] for f in figures[:best] if f["mean"] is not None)
        why = (f"{won['name']} {won['mean']:.4f} beats every cheaper candidate on validation (best cheaper "
               f"{beaten:.4f}) by more than {margin:g}, and no costlier one beats it")
    return {"index": best, "name": won["name"], "why": why, "rule": rule}
