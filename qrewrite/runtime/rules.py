"""The rules: the text a release sends without a model. A release that is a rule, the eval's rule candidates and
the gateway's fallback all take their text from here."""

from __future__ import annotations

from ..errors import QrewriteError
from .route import fallback_text

# rule name → the text sent for a row (query, profile, history)
RULES = {"raw": lambda row: row["query"], "query_history": fallback_text}


def rule_text(rule: str, row: dict) -> str:
    try:
        fn = RULES[rule]
    except KeyError:
        raise QrewriteError(f"unknown rule {rule!r}", hint=f"the rules: {', '.join(RULES)}") from None
    return fn(row)


def check_rule(rule: str, where: str) -> None:
    """Raise naming `where` (a release.json) when `rule` is not one of RULES."""
    if rule not in RULES:
        raise QrewriteError(f"names rule {rule!r}, which the runtime does not know", file=where,
                            hint=f"the rules: {', '.join(RULES)}; rerun the release stage")
