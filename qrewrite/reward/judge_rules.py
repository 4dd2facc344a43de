"""The rule judge (``reward.judge.provider: rule``, the embedded default, ``rules-v3``): a rewrite scored 1..5
with a reason, against the teacher's rewrite of the same question (the reference), by deterministic rules; no
model, no network.

Reference-based, in the spirit of an LLM judge shown the teacher's answer: does the rewrite carry what the
reference resolved (the referent and slots it wrote in from the conversation), keep what the question asks (the
words the reference kept), and leave out what the reference dropped (typos, pronouns) and what nobody said
(an invented or another conversation's referent)? Then the checks that hold for any tenant: not an answer, not a
question back, one line and one query, no label or chat-template tokens, the tenant's script (names in another
script are allowed), a length near the reference's.

Words are compared as *content units*: for a Chinese tenant jieba's words without the stopwords, for an English
one Latin words and numbers (lower-cased, a plural or verb ending cut), each weighted by its inverse document
frequency in the tenant's KB, so a product name or "Alhambra" counts for more than "please" or "怎么". No unit check assumes that the raw question retrieves the right
documents, and none needs the KB's titles. Without a reference only the form checks run (and the verdict says so).
"""

from __future__ import annotations

import math
import re
from collections import Counter

from ..text import EN_STOPWORDS, normalize, tokenize_parts
from . import RULE_JUDGE_MODEL
from .verdict import Verdict

# A leading label such as "改写后的查询：", "Rewrite:", "Rewritten query:", "检索语句：", "Output:".
_LABEL = re.compile(
    r"^\s*[\"'“‘「【\[]?\s*(改写|重写|rewrit\w*|query|search query|查询|检索|output|输出|answer|答案?|回答)"
    r"[^\n:：]{0,12}[:：]", re.IGNORECASE)
# Answering or explaining instead of rewriting.
_ANSWER = re.compile(
    r"(答案|回答|解答|解释|说明|注意|备注|理由|原因|以下是|首先|其次)\s*[:：]|^\s*(您好|你好|亲[,，!！])|"
    r"建议您|您可以|你可以|\b(answer|explanation|note|reason)\s*:|\bhere(?: is|'s| are)\b|\bi would\b|\bi think\b",
    re.IGNORECASE)
# Asking the user back (clarification requests) instead of rewriting.
_ASK_BACK = re.compile(
    r"(您|你)(是|是不是)?(是指|是说|指的是|说的是|想问|要问|问的是|想要|想了解|需要|能否|可否|方便|具体)|请(您|你)?(提供|说明|告诉|补充|确认|描述)|"
    r"是否(需要|想)|\bdo you (mean|want|need)\b|\bplease (clarify|specify|provide)\b|\bwhich one do you\b|"
    r"\bcould you (clarify|specify|tell me which)\b", re.IGNORECASE)
_QUESTION = re.compile(r"[?？吗呢么嘛]|怎|什么|多少|哪|几|能否|是否|如何|为什么|为啥|啥|咋|可不可以|能不能|还是|"
                       r"会不会|要不要|有没有|是不是|行不行|\b(how|what|which|when|where|why|can|does|is|are)\b",
                       re.IGNORECASE)
# Declarative verdicts: what an answer says ("可以吃", "建议饭后", "不需要").
_VERDICT = re.compile(r"(^|[，,。；;])\s*(可以|不可以|能|不能|不建议|建议|需要|不需要|无需|是的|不是|没有|有的|"
                      r"放心|注意|一般|通常|每日|每天|每次)")
_CHAT_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>|</?s>|\[/?INST\]|<think>|</think>", re.IGNORECASE)
_SEPARATORS = re.compile(r"[#|/;；、]")
_SENTENCES = re.compile(r"[^。！!？?]+[。！!？?]*")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")
_LATIN_WORD = re.compile(r"[a-z]+|[0-9]+")
_EN_STOP = EN_STOPWORDS | frozenset("i'm im me my the this that these those there it's its be been will would should "
                                    "shall am an at as by from into if then than so up out".split())


def _stem(word: str) -> str:
    """A light English stemmer: enough that "stations"/"station", "reserved"/"reserve" meet."""
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + keep
    return word


def content_units(text: str, language: str = "zh") -> set[str]:
    """The content units of ``text``: words without the stopwords (jieba's search-mode words for Chinese,
    Latin words and numbers, stemmed, for English); in an English text a CJK character is a unit of its own."""
    t = normalize(text)
    if language == "zh":
        return {w for w in tokenize_parts(t, "zh")[0] if w not in _EN_STOP}
    units = {_stem(w) for w in _LATIN_WORD.findall(t) if w not in _EN_STOP and not (len(w) == 1 and w in "ai")}
    return units | set(_CJK.findall(t))


class UnitWeights:
    """How much a content unit says: its inverse document frequency over the tenant's KB, log(1 + (N+1)/(1+df)).
    A unit the KB never uses (phrasing such as "哪些", "比较"; a typo) weighs ``UNKNOWN`` of a rare KB unit: it
    cannot be a referent the KB knows, and rewording a question must not cost as much as losing its subject."""

    UNKNOWN = 0.35

    def __init__(self, texts: list[str] | None = None, language: str = "zh"):
        self.language = language
        self.df: Counter = Counter()
        self.docs_with: dict[str, set[int]] = {}
        for i, t in enumerate(texts or []):
            units = content_units(t, language)
            self.df.update(units)
            for u in units:
                self.docs_with.setdefault(u, set()).add(i)
        self.n = len(texts or [])
        self.rare = math.log(1.0 + (self.n + 1) / 2.0)

    def known(self, unit: str) -> bool:
        return self.df.get(unit, 0) > 0 or not self.n

    def __call__(self, unit: str) -> float:
        df = self.df.get(unit, 0)
        return math.log(1.0 + (self.n + 1) / (1.0 + df)) if df or not self.n else self.UNKNOWN * self.rare

    def total(self, units: set[str]) -> float:
        return sum(self(u) for u in units)

    def mass(self, units: set[str]) -> float:
        """``units``' weight in rare units (a unit in exactly one KB document weighs 1)."""
        return self.total(units) / self.rare if self.rare > 0 else float(len(units))

    def key_terms(self, text: str, k: int) -> list[str]:
        """The `k` content units of `text` that the KB uses least often (its heaviest known units, ties by the
        unit): what picks out the documents, which the distilled judge is shown because it never sees the KB
        (reward.judge.model.key_terms). A unit the KB never uses is left out: phrasing or a typo; so is a part of a
        unit already named (jieba's search mode also cuts "鱼油" out of "深海鱼油"): the longer unit first on ties."""
        units = sorted((u for u in content_units(text or "", self.language) if self.known(u)),
                       key=lambda u: (-self(u), -len(u), u))
        out: list[str] = []
        for u in units:
            if len(out) < k and not any(u in v for v in out):
                out.append(u)
        return out

    def specific(self, units: set[str]) -> float:
        """Like ``mass`` with each unit's share squared: a name or a slot value (found in few documents) counts
        about 1, a common word ("take", "吃") almost nothing."""
        return sum((self(u) / self.rare) ** 2 for u in units) if self.rare > 0 else float(len(units))


def _corrects(unit: str, said: set[str]) -> bool:
    """``unit`` spells a said unit right: same length, at least half its characters the same and in place
    ("申论" for "申轮", "rout" for "raut"); a typo fix is not an invention."""
    return any(len(v) == len(unit) >= 2 and sum(a == b for a, b in zip(v, unit)) * 2 >= len(unit) for v in said)


def _share(part: set[str], whole: set[str], w: UnitWeights) -> float:
    total = w.total(whole)
    return w.total(part & whole) / total if total > 0 else 1.0


class RuleJudge:
    """Deterministic reference-based judge (embedded default, ``rules-v3``): 5 minus penalties, floored at 1.

    Against the reference R (the teacher's rewrite of the same question Q; C = profile + history):

    * **resolved**: the units R added to Q (referent, slots) must be in the rewrite: up to -3 as their weighted
      share falls to 0, scaled by how much of R they are;
    * **kept**: the units R kept from Q (what is asked) must stay: up to -2;
    * **dropped**: units of Q or C that R left out (a typo, a pronoun, the history's other product) must stay
      out: up to -2 by their share of the rewrite;
    * **invented**: units nobody said (not in R, Q or C: another conversation's referent, an answer's facts):
      up to -2 by their share of the rewrite;
    * **form**: answers instead of rewriting -3; asks the user back -3; chat-template tokens -3; a script other
      than the tenant's (names aside) -3; a keyword bag -2.5; a label ("改写：") -1.5; more than one line or
      sentence -1.5; longer than 1.5x / 2.5x the reference (+ 10 characters) -1.5 / -2.5; no longer a question
      while the user asked one -1.
    """

    provider = "rule"
    model = RULE_JUDGE_MODEL

    def __init__(self, language: str = "zh", docs: list | None = None):
        """``docs``: the tenant's KB, whose unit frequencies weight the units (unweighted without)."""
        self.language = language
        self.weights = UnitWeights([d.text for d in docs] if docs else [], language)
        self.calls = 0

    # ---------------------------------------------------------------------------------- pieces
    def _form_checks(self, query: str, rewrite: str, reference: str | None, context: str) -> list[tuple[str, float]]:
        raw = rewrite.strip()
        issues: list[tuple[str, float]] = []
        if _CHAT_TOKEN.search(raw):
            issues.append(("chat-template tokens", 3.0))
        lines = [ln for ln in raw.splitlines() if ln.strip()]
        if len(lines) > 1:
            issues.append((f"{len(lines)} lines", 1.5))
        if _LABEL.search(raw):
            issues.append(("leading label", 1.5))
        if self._off_script(raw, f"{query} {context} {reference or ''}"):
            issues.append(("not in the tenant's language", 3.0))
        sentences = [s.strip() for s in _SENTENCES.findall(raw) if s.strip(" 。！!？?")]
        # A statement after the question, or a rewrite that is a statement ending in "。", answers it.
        stated = [s for s in sentences[1:] if not _QUESTION.search(s)] or \
            [s for s in sentences[:1] if s.endswith("。") and not _QUESTION.search(s)]
        if _ANSWER.search(raw) or (self.language == "zh" and (
                stated or (_VERDICT.search(raw) and not _QUESTION.search(raw)))):
            issues.append(("answers instead of rewriting", 3.0))
        elif len(sentences) > 1 and (reference is None or len(_SENTENCES.findall(reference.strip())) < len(sentences)):
            issues.append(("more than one sentence", 1.5))
        if _ASK_BACK.search(raw) and not (reference and _ASK_BACK.search(reference)):
            issues.append(("asks the user back", 3.0))
        if _QUESTION.search(query or "") and not _QUESTION.search(raw) and \
                (reference is None or _QUESTION.search(reference)):
            issues.append(("no longer a question", 1.0))
        text = normalize(raw)
        cjk_segments = [s for s in re.split(r"\s+", text) if _CJK.search(s)]
        # Terms listed between separators ("X,储存,保存,存放" / "x | y | z"): a keyword bag in any language.
        pieces = [p for p in re.split(r"[,，、;；|#/]+", text) if p.strip()]
        listed = len(pieces) >= 4 and sum(len(p.split()) for p in pieces) <= 2 * len(pieces) and \
            sum(len(p) for p in pieces) <= 8 * len(pieces)
        if len(cjk_segments) >= 3 or len(_SEPARATORS.findall(text)) >= 2 or listed or self._repeats(text):
            issues.append(("keyword bag, not a sentence", 2.5))
        limit = len(normalize(reference)) + 10 if reference else len(normalize(query)) * 2 + 20
        if len(text) > 2.5 * limit:
            issues.append((f"far too long ({len(text)} chars)", 2.5))
        elif len(text) > 1.5 * limit:
            issues.append((f"too long ({len(text)} chars)", 1.5))
        return issues

    def _off_script(self, rewrite: str, said: str) -> bool:
        """Written in another script than the tenant's; words that the conversation or reference used (names
        such as "DHA", "Microsoft", "北京") do not count either way."""
        said_units = content_units(said, "en") | content_units(said, "zh")
        own = [u for u in content_units(rewrite, "en") | content_units(rewrite, "zh") if u not in said_units]
        cjk = sum(1 for u in own if _CJK.search(u))
        latin = len(own) - cjk
        if self.language == "zh":
            return (not _CJK.search(rewrite)) or latin > 2 * max(cjk, 1)
        return cjk > max(latin, 1)

    @staticmethod
    def _repeats(text: str) -> bool:
        """The same content unit three times or more: a keyword bag's repetition ("# 医品 # 医品")."""
        words = _LATIN_WORD.findall(text) + [a + b for run in _CJK_RUN.findall(text) for a, b in zip(run, run[1:])]
        counts = Counter(w for w in words if w not in _EN_STOP)
        return bool(counts) and counts.most_common(1)[0][1] >= 3

    def _content_checks(self, query: str, context: str, rewrite: str, reference: str) -> list[tuple[str, float]]:
        w = self.weights
        lang = self.language
        q, r, c, x = (content_units(t, lang) for t in (query, reference, context, rewrite))
        issues = []
        # Penalties grow with how much is at stake in "rare units" (w.mass: a KB unit found in one document is
        # 1), so one missing product name costs the full penalty and a reworded particle little.
        # The missing share of the units, by weight, scaled by what they weigh (a product name: all of the
        # penalty; a reworded particle: little); what the question asks weighs at least half, however common its
        # words ("吃"). Shares, not absolute mass, so a paraphrase that misses one of many words loses little.
        for what, units, most, floor in (("misses {:.0%} of what the reference resolved", r - q, 3.0, 0.0),
                                         ("drops {:.0%} of what the question asks", r & q, 2.0, 0.5)):
            if units:
                missing = 1.0 - _share(x, units, w)
                penalty = most * missing * min(1.0, floor + w.mass(units))
                if penalty > 0.1:
                    # name the heaviest missing units, as "adds what nobody said" names its own: an auditor sees
                    # what was lost, and the distilled judge learns a reason it can copy from its input
                    lost = sorted(units - x, key=lambda u: (-w(u), u))[:3]
                    named = f" ({', '.join(lost)})" if lost else ""
                    issues.append((what.format(missing) + named, round(penalty, 4)))
        ref_text = normalize(reference)
        # a typo, a pronoun, the history's other product: the reference left it out (a unit inside one of the
        # reference's words, "好" in "最好", is a segmentation difference, not a leftover)
        dropped = {u for u in x & ((q | c) - r) if u not in ref_text}
        if dropped and w.specific(dropped) > 0.07:
            issues.append((f"keeps what the reference left out ({', '.join(sorted(dropped)[:3])})",
                           round(min(2.0, 1.5 * w.specific(dropped)), 4)))
        said = q | c | r
        # A referent the KB knows, said by nobody (one CJK character, "好", names nothing): neither a typo fix of a
        # said word, nor the rest of a name the
        # rewrite itself names (a KB document holds both it and a said, specific unit of the rewrite: "申论" →
        # "申论写作精品班").
        anchors = {u for u in x & said if w.specific({u}) >= 0.5}
        near = set().union(*(w.docs_with.get(a, set()) for a in anchors)) if anchors else set()
        invented = {u for u in x - said if w.known(u) and not _corrects(u, said) and not _CJK.fullmatch(u)
                    and not (w.docs_with.get(u, set()) & near)}
        if invented:
            penalty = min(2.0, 1.5 * w.specific(invented))
            if penalty > 0.1:
                issues.append((f"adds what nobody said ({', '.join(sorted(invented)[:3])})", round(penalty, 4)))
        return issues

    # ---------------------------------------------------------------------------------- verdict
    def score(self, query: str, profile: str, history: str, rewrite: str, reference: str | None = None) -> Verdict:
        self.calls += 1
        raw = (rewrite or "").strip()
        if not raw:
            return Verdict(1.0, "empty rewrite")
        reference = (reference or "").strip() or None
        context = f"{profile or ''} {history or ''}"
        issues = self._form_checks(query or "", raw, reference, context)
        if reference is not None:
            issues += self._content_checks(query or "", context, raw, reference)
        score = max(1.0, 5.0 - sum(p for _, p in issues))
        reason = "; ".join(f"{what} (-{p:g})" for what, p in issues) or "ok"
        if reference is None:
            reason += " (no reference: form checks only)"
        return Verdict(round(score, 4), reason)

    async def judge(self, query: str, profile: str, history: str, rewrite: str,
                    reference: str | None = None) -> Verdict:
        return self.score(query, profile, history, rewrite, reference)

    def stats(self) -> dict:
        return {"judge_calls": self.calls, "judge_cache_hits": 0, "judge_failures": 0}

    async def aclose(self):
        pass
