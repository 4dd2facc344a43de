"""The rules: the text a release sends without a model. A release that is a rule, the eval's rule candidates and
the gateway's fallback all take their text from here.

raw and query_history need nothing but the row. resolve (the embedded teacher's referent resolution,
qrewrite/referent.py) needs the tenant's entity lexicon: the release stage freezes it in the release folder
(ENTITIES_FILE), so the rule answers from the folder alone, as it was scored, whatever the KB becomes later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..entities import EntityLexicon
from ..errors import QrewriteError
from ..referent import Resolver
from .route import fallback_text

# rule name → the text sent for a row (query, profile, history), for the rules that need no state
RULES = {"raw": lambda row: row["query"], "query_history": fallback_text}
# rules that need the release folder's frozen state
STATEFUL = ("resolve",)
ENTITIES_FILE = "entities.json"


def rule_text(rule: str, row: dict) -> str:
    try:
        fn = RULES[rule]
    except KeyError:
        raise QrewriteError(f"unknown rule {rule!r}", hint=f"the rules: {', '.join(RULES)}") from None
    return fn(row)


def resolver_rule(lexicon: EntityLexicon) -> Callable[[dict], str]:
    resolver = Resolver(lexicon)
    return lambda row: resolver.rewrite(row["query"], row.get("profile") or "", row.get("history") or "")


def load_rule(rule: str, folder: str | Path) -> Callable[[dict], str]:
    """The text function of a rule release in `folder`: a stateless rule's, or resolve over the lexicon frozen
    there. Raises naming the folder when the rule is unknown or its state is missing."""
    where = str(Path(folder))
    check_rule(rule, where)
    if rule in RULES:
        return RULES[rule]
    path = Path(folder) / ENTITIES_FILE
    try:
        lexicon = EntityLexicon.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise QrewriteError(f"rule {rule} needs the entity lexicon frozen with the release ({type(exc).__name__})",
                            file=str(path), hint="rerun the release stage") from None
    if not lexicon.entities:
        raise QrewriteError(f"rule {rule}: the frozen lexicon names no entity", file=str(path),
                            hint="rerun the release stage")
    return resolver_rule(lexicon)


def check_rule(rule: str, where: str) -> None:
    """Raise naming `where` (a release.json) when `rule` is not one of the rules."""
    if rule not in RULES and rule not in STATEFUL:
        raise QrewriteError(f"names rule {rule!r}, which the runtime does not know", file=where,
                            hint=f"the rules: {', '.join((*RULES, *STATEFUL))}; rerun the release stage")
