"""The release rule, pure: which candidate a tenant gets, from validation scores alone.

Candidates come in release.candidates' order: query + history first (the baseline a tenant is promised), then the
other rules, the SFT student and the trained ones, cheapest first (within a model, its decoding levers in config
order). A later candidate is released only when it beats every earlier one on validation by more than `margin_rows`
rows of tie-aware Hit@1 (the difference of means times the rows scored); otherwise the earlier keeps it. Tie-aware
Hit@1 is fractional: a candidate that only breaks a tie its way on a row or two gains a fraction of a row, which says
nothing the validation rows can resolve, so the margin is counted in rows, not as a difference of means that shrinks
toward zero. Without a row that has gold documents nothing can be shown to beat the first, so the first is released
and the decision says why.
"""

from __future__ import annotations

RULE = ("the highest validation tie-aware Hit@1; a later candidate must beat every earlier one by more than "
        "release.margin_rows ({margin_rows:g}) validation rows; otherwise the earlier keeps it (candidates in order: "
        "{order})")


def choose(figures: list[dict], margin_rows: float) -> dict:
    """{index, name, why, rule, margin} of the candidate to release (margin: margin_rows as a difference of means).
    `figures`: in release order, each {name, mean, n} (mean None or n 0: no validation row with gold)."""
    if not figures:
        raise ValueError("no release candidates")
    rule = RULE.format(margin_rows=margin_rows, order=", ".join(f["name"] for f in figures))
    n = max((f.get("n") or 0) for f in figures)
    if not n:
        return {"index": 0, "name": figures[0]["name"], "rule": rule, "margin": None,
                "why": "no validation row has gold documents: nothing can be shown to beat the first candidate"}
    margin = margin_rows / n
    best = 0
    for i in range(1, len(figures)):
        mean = figures[i]["mean"]
        earlier = max(f["mean"] for f in figures[:i] if f["mean"] is not None)
        if mean is not None and mean > earlier + margin + 1e-12:
            best = i
    won = figures[best]
    if best == 0:
        why = (f"no later candidate beat {won['name']} ({won['mean']:.4f}) on validation by more than "
               f"{margin_rows:g} of {n} rows")
    else:
        beaten = max(f["mean"] for f in figures[:best] if f["mean"] is not None)
        why = (f"{won['name']} {won['mean']:.4f} beats every earlier candidate on validation (best earlier "
               f"{beaten:.4f}) by {(won['mean'] - beaten) * n:.2f} rows of {n}, more than {margin_rows:g}, and no "
               f"later one beats it by as much")
    return {"index": best, "name": won["name"], "why": why, "rule": rule, "margin": round(margin, 6)}
