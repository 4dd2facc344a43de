"""Intervals and paired tests over per-query scores (numpy only, seeded: reruns give the same numbers).

* `mean_ci`: percentile bootstrap interval of a mean (resampling queries).
* `paired`: candidate A vs B on the same queries: mean difference, its paired bootstrap interval (the
  same resampled queries for both) and a two-sided sign-flip permutation p-value (exact up to 2^16 sign
  patterns, else 20,000 random ones), so "RL beats SFT" is a claim with an interval and a p-value.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

EXACT_MAX_N = 16
RANDOM_FLIPS = 20_000


def _clean(values) -> np.ndarray:
    return np.array([float(v) for v in values if v is not None and not math.isnan(float(v))], dtype=float)


def mean_ci(values, *, samples: int, seed: int, confidence: float) -> dict:
    """{mean, ci_low, ci_high, n}; None fields when there is nothing to average."""
    x = _clean(values)
    if x.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return {"mean": round(float(x.mean()), 6), "ci_low": round(float(lo), 6), "ci_high": round(float(hi), 6),
            "n": int(x.size)}


def sign_flip_p(d: np.ndarray, seed: int) -> float:
    """Two-sided p-value of mean(d) = 0 under random sign flips of the paired differences."""
    n = d.size
    if n == 0 or not np.any(d):
        return 1.0
    observed = abs(d.mean())
    if n <= EXACT_MAX_N:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        null = np.abs((signs * d).mean(axis=1))
        return float(np.mean(null >= observed - 1e-12))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(RANDOM_FLIPS, n))
    null = np.abs((signs * d).mean(axis=1))
    return float((np.sum(null >= observed - 1e-12) + 1) / (RANDOM_FLIPS + 1))


def paired(a: list, b: list, *, samples: int, seed: int, confidence: float) -> dict:
    """A − B over the queries where both have a value: {diff, ci_low, ci_high, p_value, n, a_better, b_better}."""
    pairs = [(float(x), float(y)) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return {"diff": None, "ci_low": None, "ci_high": None, "p_value": None, "n": 0, "a_better": 0, "b_better": 0}
    d = np.array([x - y for x, y in pairs])
    ci = mean_ci(d, samples=samples, seed=seed, confidence=confidence)
    return {"diff": ci["mean"], "ci_low": ci["ci_low"], "ci_high": ci["ci_high"],
            "p_value": round(sign_flip_p(d, seed), 6), "n": int(d.size),
            "a_better": int(np.sum(d > 1e-12)), "b_better": int(np.sum(d < -1e-12))}


def percentile(values, pct: float) -> float | None:
    x = _clean(values)
    return None if x.size == 0 else round(float(np.percentile(x, pct)), 6)
