"""What the teacher stage checks on its own output: a teacher that hands the questions back unchanged.

Trained on such rows the student learns to copy the question, and validation only shows "no gain"; so the
stage says it on the console, in its stats and (through them) in summary.json → warnings.
"""

from __future__ import annotations

import logging
import re

from ..text import normalize

log = logging.getLogger("qrewrite.teacher")

# Warn when at least this share of the successful rewrites is the question itself.
UNCHANGED_WARN_SHARE = 0.9


def bare(text: str) -> str:
    """The text as the comparison sees it: normalised, without spaces and punctuation ("那它呢？" = "那它呢")."""
    return re.sub(r"[\W_]+", "", normalize(text))


def unchanged_check(queries: list[dict], results: list[dict], teacher) -> dict:
    """Stats entries: how many successful rewrites equal their question, the share, and the warning (if any)."""
    question = {q["id"]: q["query"] for q in queries}
    ok = [r for r in results if r["status"] == "ok"]
    n = sum(1 for r in ok if bare(r["rewrite"]) == bare(question[r["id"]]))
    share = n / len(ok) if ok else 0.0
    warnings = []
    if ok and share >= UNCHANGED_WARN_SHARE:
        if teacher.provider == "resolve":
            todo = ("the rule teacher rewrites only questions that name a product or course of the KB titles loosely "
                    "or leave it to the history: use `teacher.provider: openai` (a strong model) for this tenant")
        elif teacher.provider == "column":
            todo = (f"the reference column ({teacher.column}, tenants[].columns.rewrite) holds the questions "
                    f"themselves: check that it maps the rewrite column, or use `teacher.provider: openai`")
        else:
            todo = (f"check that the teacher model ({teacher.model}) follows tenants[].system_prompt and returns the "
                    f"rewritten query, or use a stronger one (teacher.openai.model)")
        text = (f"teacher {teacher.provider} handed back {n} of {len(ok)} questions ({share:.0%}) unchanged (after "
                f"normalisation): trained on them, the student learns to copy the question; {todo}")
        log.warning(text)
        warnings.append({"code": "teacher_unchanged", "message": text})
    return {"unchanged": n, "unchanged_share": round(share, 4) if ok else None, "warnings": warnings}
