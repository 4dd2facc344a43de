"""Judgement items from what the pipeline already has: (question, profile, history, the reference rewrite, a
candidate) with a verdict, a target score and a rationale.

Candidates and where their label comes from (``label_source``):

* ``teacher`` (good), ``raw`` and ``other_row`` (bad): the derived labels of the judge's own check
  (``signals.derived_judge_labels``: a validated teacher rewrite that puts a gold document first, the raw question
  it resolved, another conversation's rewrite);
* ``student``: the SFT model's sampled rewrites of a question with gold documents, good when the tenant's RAG puts a
  gold document alone at rank 1 (tie-aware Hit@1 = 1), else bad (``retrieval``);
* ``red_team``: the eval candidates' rewrites of the red-team questions, good when they pass every red-team check
  (``red_team``).

With the embedded defaults the rationale is the rule judge's reason for the same candidate (``rationale_source:
rule``) and the target score keeps the verified verdict (4-5 for good, 1-2 for bad, the rule score inside that
range): a model distilled from rules and retrieval, not from an LLM. With ``reward.judge.provider: openai`` the
configured strong judge (cached) gives the score and the reason instead (``llm``), and its verdict is the label.

Held out by question, never by row: an item is held out when its question is one of the eval's test questions or
``signals.heldout`` puts it in the held-out half; every candidate of a question stays on one side.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from ..data.red_team import check_rewrite, passed
from ..metrics import gold_ranking
from ..signals import derived_judge_labels, heldout
from ..text import normalize
from ..reward.judge_prompt import GOOD_AT

KINDS = ("teacher", "raw", "other_row", "student", "red_team")


def item_id(query_id: str, candidate: str) -> str:
    return hashlib.sha256(f"{query_id}\x1f{candidate}".encode("utf-8")).hexdigest()[:16]


def target_score(label: str, rule_score: float | None) -> int:
    """The verified verdict, graded by the rule judge within it: good 4-5, bad 1-2."""
    s = round(rule_score) if rule_score is not None else (5 if label == "good" else 1)
    return max(4, min(5, s)) if label == "good" else max(1, min(2, s))


def base_items(validated: list[dict], queries: list[dict]) -> list[dict]:
    out = []
    for r in derived_judge_labels(validated, queries):
        kind = {"raw": "raw", "other_row": "other_row"}.get(r["failure"], "teacher")
        out.append({"query_id": r["query_id"], "query": r["query"], "profile": r["profile"], "history": r["history"],
                    "reference": r["reference"], "candidate": r["rewrite"], "kind": kind, "label": r["label"],
                    "label_source": "derived"})
    return out


def student_items(samples: list[dict], context: dict[str, dict], references: dict[str, str], retrieve) -> list[dict]:
    """`samples`: [{query_id, rewrite}]; `retrieve(query_id, text)` -> the RAG's hits for that rewrite of that
    question. Questions without gold are skipped (no verifiable label)."""
    out = []
    for s in samples:
        q = context.get(s["query_id"])
        if q is None or not q.get("gold_doc_ids") or not (s.get("rewrite") or "").strip() \
                or s["query_id"] not in references:
            continue
        hit = gold_ranking(retrieve(s["query_id"], s["rewrite"]), q["gold_doc_ids"])["hit_at_1"]
        out.append({"query_id": s["query_id"], "query": q["query"], "profile": q.get("profile") or "",
                    "history": q.get("history") or "", "reference": references[s["query_id"]],
                    "candidate": s["rewrite"], "kind": "student", "label": "good" if hit == 1.0 else "bad",
                    "label_source": "retrieval"})
    return out


def red_team_items(rows: list[dict], rewrites: dict[str, dict[str, str]]) -> list[dict]:
    """`rows`: the tenant's red-team rows; `rewrites`: {candidate name: {query_id: rewrite}}."""
    out = []
    for r in rows:
        for name, by_id in sorted(rewrites.items()):
            text = (by_id.get(r["query_id"]) or "").strip()
            if not text:
                continue
            ok = passed(check_rewrite(text, r["expect"]))
            out.append({"query_id": r["query_id"], "query": r["query"], "profile": r.get("profile") or "",
                        "history": r.get("history") or "", "reference": None, "candidate": text,
                        "kind": "red_team", "label": "good" if ok else "bad", "label_source": "red_team",
                        "source_candidate": name})
    return out


def attach_key_terms(items: list[dict], terms) -> None:
    """Each item with a reference gets `key_terms`, `terms(reference)`: what the model judge is shown beside the
    reference (reward.judge.model.key_terms; ``judges.key_terms_of``). `terms` None: none (not shown)."""
    for it in items:
        if terms and it.get("reference"):
            it["key_terms"] = terms(it["reference"])


_PENALTY = re.compile(r" \(-\d+(?:\.\d+)?\)")
_SHARE = re.compile(r"\b\d+% of ")


def compact_reason(reason: str) -> str:
    """A rule reason as the distilled judge's target: without the penalties ("(-1.5)") and shares ("33% of "),
    which are arithmetic over the tenant's KB weights that the judge never sees; the named units stay (copied from
    its input), and the score says how much they cost. Shorter replies also cost fewer tokens per judgement."""
    return _SHARE.sub("", _PENALTY.sub("", reason)).strip()


async def rationales(items: list[dict], judge, *, llm_labels: bool) -> None:
    """Each item gets `reason` and `score` from `judge` (rule or the strong API judge). With `llm_labels` the
    judge's verdict is the label (score >= GOOD_AT good); otherwise the verified label stays."""
    verdicts = await asyncio.gather(*(judge.judge(it["query"], it["profile"], it["history"], it["candidate"],
                                                  it["reference"]) for it in items))
    for it, v in zip(items, verdicts):
        it["reason"] = v.reason if llm_labels else compact_reason(v.reason)
        it["rationale_source"] = "llm" if llm_labels else "rule"
        if llm_labels:
            if v.score is None:
                it["label"] = None  # the strong judge failed on it: no label, dropped
                continue
            it["label"] = "good" if v.score >= GOOD_AT else "bad"
            it["label_source"] = "llm"
            it["score"] = int(round(v.score))
        else:
            it["score"] = target_score(it["label"], v.score)


def assign(items: list[dict], test_questions: set[str]) -> list[dict]:
    """Split by question (module doc), drop repeats of a (question, candidate) and unlabelled items."""
    seen, out = set(), []
    for it in items:
        key = (normalize(it["query"]), normalize(it["candidate"]))
        if key in seen or it.get("label") not in ("good", "bad"):
            continue
        seen.add(key)
        held = normalize(it["query"]) in test_questions or heldout(it["query"])
        out.append({"item_id": item_id(it["query_id"], it["candidate"]), **it,
                    "split": "heldout" if held else "train"})
    return out


def counts(items: list[dict]) -> dict:
    by = {}
    for it in items:
        k = by.setdefault(it["split"], {}).setdefault(it["kind"], {"good": 0, "bad": 0})
        k[it["label"]] += 1
    return by
