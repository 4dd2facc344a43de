"""What the distilled judge reads and writes: a short instruction, the material as the API judge gets it (one JSON
object: query, user_profile, history_summary, reference_rewrite, rewrite), and a reply of one JSON object with a
short reason *before* the score, ``{"reason": "...", "score": N}``, which ``judge_openai.parse_judge_reply`` (the
API judge's strict parser) reads. The instruction is short because the model learns the task from its training
data; the API judge's long rubric would cost every judgement hundreds of tokens on a CPU.
"""

from __future__ import annotations

import json

from .judge_openai import parse_judge_reply

_TASK = ("Grade the rewrite of a search query against the reference rewrite of the same question: does it ask "
         "for what the user asks, with the referent resolved from the profile and history, as one standalone "
         "query? ")
# With reward.judge.model.key_terms the material also names the reference's key terms: the words the tenant's KB
# uses least often, which pick out the documents (the rule judge weighs words by the KB; this judge never sees it).
_KEY_TERMS = ("key_terms are the reference's words that the knowledge base uses least often: they pick out the "
              "documents, and a rewrite that loses one may retrieve others. ")
_REPLY = 'Reply with one JSON object: a short reason, then an integer score 1-5 (5 best): {"reason": "...", "score": N}'
SYSTEM = _TASK + _REPLY
SYSTEM_KEY_TERMS = _TASK + _KEY_TERMS + _REPLY
GOOD_AT = 3  # a score of 3 or more is a "good" verdict


def material(query: str, profile: str, history: str, reference: str | None, rewrite: str,
             key_terms: list[str] | None = None) -> str:
    data = {"query": query or "", "user_profile": profile or "", "history_summary": history or ""}
    if reference:
        data["reference_rewrite"] = reference
        if key_terms:
            data["key_terms"] = list(key_terms)
    data["rewrite"] = rewrite or ""
    return json.dumps(data, ensure_ascii=False)


def messages(item: dict) -> list[dict]:
    """The chat of an item; its `key_terms` (a list, set by judge-data and the model judge when
    reward.judge.model.key_terms > 0) join the material and the instruction says what they are."""
    terms = item.get("key_terms") if item.get("reference") else None
    return [{"role": "system", "content": SYSTEM_KEY_TERMS if terms else SYSTEM},
            {"role": "user", "content": material(item["query"], item.get("profile", ""), item.get("history", ""),
                                                 item.get("reference"), item["candidate"], terms)}]


def reply(reason: str, score: int) -> str:
    """The target reply: reason first (it is written before the score is decided), then the score."""
    return json.dumps({"reason": reason, "score": int(score)}, ensure_ascii=False)


def read_reply(text: str) -> tuple[float, str] | None:
    """(score, reason) of a reply, None when it does not parse (a format failure)."""
    try:
        return parse_judge_reply(text)
    except ValueError:
        return None


def verdict(score: float | None) -> str | None:
    return None if score is None else ("good" if score >= GOOD_AT else "bad")
