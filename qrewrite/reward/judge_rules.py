"""The rule judge (``reward.judge.provider: rule``, the embedded default): a rewrite's form scored 1..5
with a reason, by deterministic rules over the tenant's entity lexicon and KB, no model, no network.

It checks what a rewrite must do: name the referent, keep the aspect asked about, not answer or ask back,
stay one fluent query of sensible length. A proxy for an LLM judge (``judge_openai.py``), not a
replacement; measured on labelled sets (AUC in eval.json).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from ..entities import EntityLexicon, _sound
from . import RULE_JUDGE_MODEL
from ..rag.local import LocalRetriever
from ..text import normalize, tokenize_parts
from .verdict import Verdict

# A leading label such as "改写后的查询：", "Rewrite:", "Rewritten query:", "检索语句：", "Output:".
_LABEL = re.compile(
    r"^\s*[\"'“‘「【\[]?\s*(改写|重写|rewrit\w*|query|search query|查询|检索|output|输出|answer|答案?|回答)"
    r"[^\n:：]{0,12}[:：]", re.IGNORECASE)
_REWRITE_WORD = re.compile(r"^\s*(改写|重写|rewrite\b|rewritten\b)", re.IGNORECASE)
# Answering or explaining instead of rewriting.
_ANSWER = re.compile(
    r"(答案|回答|解答|解释|说明|注意|备注|理由|原因|以下是|首先|其次)\s*[:：]|^\s*(您好|你好|亲[,，!！])|"
    r"建议您|您可以|你可以|\b(answer|explanation|note|reason)\s*:|\bhere(?: is|'s)\b|\bi would\b|\bi think\b",
    re.IGNORECASE)
# Asking the user back (clarification requests) instead of rewriting.
_ASK_BACK = re.compile(
    r"(您|你)(是|是不是)?(是指|是说|指的是|说的是|想问|要问|问的是|想要|想了解|需要|能否|可否|方便|具体)|请(您|你)?(提供|说明|告诉|补充|确认|描述)|"
    r"是否(需要|想)|\b(could|can|would) you\b|\bdo you (mean|want|need)\b|\bplease (clarify|specify|provide)\b",
    re.IGNORECASE)
_CJK = re.compile(r"[\u4e00-\u9fff]")


_QUESTION = re.compile(r"[?？吗呢么嘛]|怎|什么|多少|哪|几|能否|是否|如何|为什么|为啥|啥|咋|可不可以|能不能|还是|"
                       r"会不会|要不要|有没有|是不是|行不行|\b(how|what|which|when|where|why|can|does|is|are)\b",
                       re.IGNORECASE)
# Declarative verdicts: what an answer says ("可以吃", "建议饭后", "不需要").
_VERDICT = re.compile(r"(^|[，,。；;])\s*(可以|不可以|能|不能|不建议|建议|需要|不需要|无需|是的|不是|没有|有的|"
                      r"放心|注意|一般|通常|每日|每天|每次)")
_CHAT_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>|</?s>|\[/?INST\]|<think>|</think>", re.IGNORECASE)
_SEPARATORS = re.compile(r"[#|/;；、]")
_SENTENCES = re.compile(r"[^。！!？?]+[。！!？?]*")
_LATIN = re.compile(r"[A-Za-z]")


class RuleJudge:
    """Deterministic rule-based judge (embedded default, ``rules-v2``): 5 minus penalties, floored at 1.

    It checks what a rewrite must do (README, "Signals"), using the tenant's entity lexicon
    (``qrewrite.entities``) and KB:

    * **referent**: the entity the question means (named in it, else the history's last, else the
      profile's) must be named: missing -3, a different one -3, with a typo kept -1.5; an entity the
      conversation never mentions -1.5;
    * **aspect**: what is asked about must stay: the KB aspects (title suffixes: 用法用量, 退费政策 …)
      that the question's words (entity names removed) retrieve are compared with the rewrite's; the
      penalty grows to -3 as their overlap falls from 0.6 to 0, so "X的功效" for a storage question, or
      the bare product name, lose;
    * **a rewrite, not an answer or a question back**: answer markers or a declarative verdict
      ("可以吃，建议…") -3; a clarification request -3; a sentence break inside -1.5; no longer a
      question while the user asked one -1;
    * **one fluent query**: a keyword bag (space- or symbol-separated terms, repeated terms) -2.5;
      more than one line -1.5; a label ("改写：") -1.5; chat-template tokens -3; not the tenant's language
      -3; longer than the question + entity + 12 characters by 1.5x -1.5, by 2.5x -2.5.

    Without a KB (``docs=None``) only the form checks run. A proxy for an LLM judge: its AUC on the
    labelled sets ``data/demo/T.judge_labels.jsonl`` is reported by ``qrewrite eval``.
    """

    provider = "rule"
    model = RULE_JUDGE_MODEL

    def __init__(self, language: str = "zh", docs: list | None = None, temperature: float = 1.0,
                 retriever: LocalRetriever | None = None):
        """``retriever``: the tenant's local retriever over ``docs``, to share its BM25 index (only its raw
        BM25 scores are used, whatever its reranker score); built from ``docs`` when not given."""
        self.language = language
        self.lexicon = EntityLexicon.from_docs(docs) if docs else None
        self.retriever = (retriever or LocalRetriever(docs, language)) if docs else None
        self.temperature = temperature
        self.calls = 0

    # ---------------------------------------------------------------------------------- pieces
    def _needed(self, query: str, profile: str, history: str, asked: np.ndarray | None) -> str | None:
        """The entity the rewrite must name: the question's own, else the conversation's, unless what is
        asked about is tenant-wide (returns, shipping: most of the aspect mass on entity-less docs).
        ``asked``: ``_doc_probs(query)``."""
        ms = self.lexicon.mentions(query)
        if ms:
            return ms[0].entity
        if asked is not None and self._group(asked, by_entity=True).get(None, 0.0) > 0.5:
            return None
        return self.lexicon.last_mentioned(history or "") or self.lexicon.last_mentioned(profile or "")

    def _without_entities(self, text: str) -> str:
        t = normalize(text)
        for m in sorted(self.lexicon.mentions(t), key=lambda m: -m.start):
            t = t[:m.start] + " " + t[m.end:]
        return t

    def _doc_probs(self, text: str) -> np.ndarray | None:
        """Softmax over the KB of what ``text`` (entities removed) retrieves; None if it retrieves nothing."""
        words, bigrams = tokenize_parts(self._without_entities(text), self.language)
        weights = dict(Counter(words + bigrams))
        if not weights:
            return None
        scores, _ = self.retriever.weighted_scores(weights, frozenset(bigrams) - set(words))
        if not (scores > 0).any():
            return None
        e = np.exp((scores.astype(np.float64) - float(scores.max())) / self.temperature)
        return e / e.sum()

    def _group(self, p: np.ndarray, by_entity: bool = False) -> dict:
        """``p`` summed per KB aspect, or per entity with ``by_entity`` (None = tenant-wide documents)."""
        out: Counter = Counter()
        for d, pi in zip(self.retriever.docs, p):
            key = self.lexicon.doc_entity.get(d.doc_id) if by_entity else self.lexicon.doc_aspect.get(d.doc_id, d.doc_id)
            out[key] += float(pi)
        return dict(out)

    def _content_checks(self, query: str, profile: str, history: str, text: str, needed: str | None,
                        asked: np.ndarray | None) -> list[tuple[str, float]]:
        issues = []
        named = self.lexicon.mentions(text)
        names = {m.entity for m in named}
        said = normalize(f"{query} {profile} {history}")
        # An entity none of whose distinctive characters the conversation used was invented.
        context = {e for e in names if any(ch in said and self.lexicon.char_weight.get(ch, 0) > 1.0
                                           for ch in normalize(e))}
        if needed is not None:
            if needed in names:
                m = next(m for m in named if m.entity == needed)
                span, name = normalize(text)[m.start:m.end], normalize(needed)
                sounds = {_sound(ch) for ch in name} - {None}
                if any(ch not in name and _sound(ch) in sounds for ch in span):  # a homophone left in
                    issues.append((f"typo kept in {needed} ({span})", 1.5))
            elif names:
                issues.append((f"names {', '.join(sorted(names))}, not {needed}", 3.0))
            else:
                issues.append((f"does not name {needed}", 3.0))
        extra = names - context - ({needed} if needed else set())
        if extra:
            issues.append((f"names {', '.join(sorted(extra))}, never mentioned", 1.5))
        if asked is not None:
            got_p = self._doc_probs(text)
            got = self._group(got_p) if got_p is not None else {}
            overlap = sum(min(p, got.get(a, 0.0)) for a, p in self._group(asked).items())
            if overlap < 0.6:
                issues.append((f"aspect kept {overlap:.0%}", round(3.0 * (0.6 - overlap) / 0.6, 4)))
        return issues

    # ---------------------------------------------------------------------------------- verdict
    def score(self, query: str, profile: str, history: str, rewrite: str) -> Verdict:
        self.calls += 1
        raw = (rewrite or "").strip()
        if not raw:
            return Verdict(1.0, "empty rewrite")
        issues: list[tuple[str, float]] = []
        if _CHAT_TOKEN.search(raw):
            issues.append(("chat-template tokens", 3.0))
        lines = [ln for ln in raw.splitlines() if ln.strip()]
        if len(lines) > 1:
            issues.append((f"{len(lines)} lines", 1.5))
        if _LABEL.search(raw) or _REWRITE_WORD.search(raw):
            issues.append(("leading label", 1.5))
        if self.language == "zh":
            cjk, latin = len(_CJK.findall(raw)), len(_LATIN.findall(raw))
            if cjk < 0.5 * latin or cjk == 0:
                issues.append(("not in the tenant's language", 3.0))
        sentences = [s.strip() for s in _SENTENCES.findall(raw) if s.strip(" 。！!？?")]
        # A statement after the question, or a rewrite that is a statement ending in "。", answers it.
        stated = [s for s in sentences[1:] if not _QUESTION.search(s)] or \
            [s for s in sentences[:1] if s.endswith("。") and not _QUESTION.search(s)]
        if _ANSWER.search(raw) or stated or (_VERDICT.search(raw) and not _QUESTION.search(raw)):
            issues.append(("answers instead of rewriting", 3.0))
        elif len(sentences) > 1:
            issues.append(("more than one sentence", 1.5))
        if _ASK_BACK.search(raw):
            issues.append(("asks the user back", 3.0))
        if _QUESTION.search(query or "") and not _QUESTION.search(raw):
            issues.append(("no longer a question", 1.0))
        text = normalize(raw)
        cjk_segments = [s for s in re.split(r"\s+", text) if _CJK.search(s)]
        clauses = [s for s in re.split(r"[\s,，]+", text) if s]
        toks = [t for t in tokenize_parts(text, self.language)[0] if len(t) > 1]
        if len(cjk_segments) >= 3 or len(clauses) >= 4 or len(_SEPARATORS.findall(text)) >= 2 \
                or (len(cjk_segments) >= 2 and len(toks) != len(set(toks))):
            issues.append(("keyword bag, not a sentence", 2.5))
        elif len(toks) != len(set(toks)):
            issues.append(("repeated terms", 1.0))
        if self.lexicon is not None:
            asked = self._doc_probs(query)  # once: both the referent and the aspect checks read it
            needed = self._needed(query, profile, history, asked)
            limit = len(normalize(query)) + (len(needed) if needed else 0) + 12
            if len(text) > 2.5 * limit:
                issues.append((f"far too long ({len(text)} chars)", 2.5))
            elif len(text) > 1.5 * limit:
                issues.append((f"too long ({len(text)} chars)", 1.5))
            issues += self._content_checks(query, profile, history, raw, needed, asked)
        score = max(1.0, 5.0 - sum(p for _, p in issues))
        reason = "; ".join(f"{what} (-{p:g})" for what, p in issues) or "ok"
        return Verdict(round(score, 4), reason)

    async def judge(self, query: str, profile: str, history: str, rewrite: str) -> Verdict:
        return self.score(query, profile, history, rewrite)

    def stats(self) -> dict:
        return {"judge_calls": self.calls, "judge_cache_hits": 0, "judge_failures": 0}

    async def aclose(self):
        pass
