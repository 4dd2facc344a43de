"""The release rule, pure: which candidate a tenant gets, from validation scores alone.

Candidates come cheapest first (the rules, then the SFT student, then the trained ones; within a model, its decoding
levers in config order). A costlier candidate is released only when it beats every cheaper one on validation by more
than `margin_rows` rows of tie-aware Hit@1 (the difference of means times the rows scored); otherwise the cheaper
keeps it. Tie-aware Hit@1 is fractional: a candidate that only breaks a tie its way on a row or two gains a
fraction of a row, which says nothing the validation rows can resolve, so the margin is counted in rows, not as a
difference of means that shrinks toward zero. Without a row that has gold documents nothing can be shown to beat
the cheapest, so the cheapest is released and the decision says why.
"""

from __future__ import annotations

RULE = ("the highest validation tie-aware Hit@1; a costlier candidate must beat every cheaper one by more than "
        "release.margin_rows ({margin_rows:g}) validation rows; otherwise the cheaper keeps it (candidates cheapest "
        "first: {order})")


def choose(figures: list[dict], margin_rows: float) -> dict:
    """{index, name, why, rule, margin} of the candidate to release (margin: margin_rows as a difference of means).
    `figures`: cheapest first, each {name, mean, n} (mean None or n 0: no validation row with gold)."""
    if not figures:
        raise ValueError("no release candidates")
    rule = RULE.format(margin_rows=margin_rows, order=" < ".join(f["name"] for f in figures))
    n = max((f.get("n") or 0) for f in figures)
    if not n:
        return {"index": 0, "name": figures[0]["name"], "rule": rule, "margin": None,
                "why": "no validation row has gold documents: nothing can be shown to beat the cheapest candidate"}
    margin = margin_rows / n
    best = 0
    for i in range(1, len(figures)):
        mean = figures[i]["mean"]
        cheaper = max(f["mean"] for f in figures[:i] if f["mean"] is not None)
        if mean is not None and mean > cheaper + margin + 1e-12:
            best = i
    won = figures[best]
    if best == 0:
        why = (f"no costlier candidate beat {won['name']} ({won['mean']:.4f}) on validation by more than "
               f"{margin_rows:g} of {n} rows")
    else:
        beaten = max(f["mean"] for f in figures[:best] if f["mean"] is not None)
        why = (f"{won['name']} {won['mean']:.4f} beats every cheaper candidate on validation (best cheaper "
               f"{beaten:.4f}) by {(won['mean'] - beaten) * n:.2f} rows of {n}, more than {margin_rows:g}, and no "
               f"costlier one beats it by as much")
    return {"index": best, "name": won["name"], "why": why, "rule": rule, "margin": round(margin, 6)}
