"""The tenant's entities (products, courses) read off the KB titles, and finding them in text.

KB titles of a product/aspect FAQ look like "<entity><aspect>" ("藻油DHA软胶囊用法用量",
"考研数学全程班退费政策"). An aspect is a title suffix that follows many different prefixes; the
entity is what is left of a title once its aspect is cut off, if at least two titles share it.
Titles with no shared entity (shipping, invoices) are tenant-wide documents.

Users name entities loosely: aliases ("鱼油", "行测"), typos and homophones ("藻由DHA", "考研政制",
"小学澳数"). A mention is a window of the text whose characters overlap the entity's, each
character weighted by how few entities contain it (片/班/课 say little, 藻/奥/行测 a lot). A
window that matches two entities equally well is ambiguous and resolves to neither.

Used by the embedded teacher (to resolve and spell the referent), the rule judge (to check it)
and the signal checks (to build the "query with the referent filled in" text).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

from pypinyin import Style, lazy_pinyin

from .kb import Doc
from .text import normalize

# A mention must carry at least this much distinctive weight and this share of the entity's weight.
MIN_WEIGHT = 2.0
MIN_COVERAGE = 0.3
STRONG_WEIGHT = 4.0       # ... or this much weight whatever the share (long names: "少儿编程Python启蒙课")
HOMOPHONE_SHARE = 0.8     # a homophone ("澳" for "奥", "付" for "辅") counts this share of the character
UNMATCHED_COST = 1.0      # per window character not in the entity (a typo costs one of these)
AMBIGUITY_MARGIN = 0.5    # the best entity must beat the runner-up by this much weight

# How Latin letters are read out in Chinese ("维生素逼片" for "维生素B片").
_LETTER_SOUND = {"b": "bi", "c": "xi", "d": "di", "e": "yi", "g": "ji", "k": "kai", "p": "pi", "q": "qiu",
                 "t": "ti", "v": "wei"}


@lru_cache(maxsize=65536)
def _sound(ch: str) -> str | None:
    """Toneless pinyin of a CJK character (or a letter's Chinese reading); None for anything else."""
    if ch in _LETTER_SOUND:
        return _LETTER_SOUND[ch]
    if not ("\u4e00" <= ch <= "\u9fff"):
        return None
    return lazy_pinyin(ch, style=Style.NORMAL)[0]


@dataclass(frozen=True)
class Mention:
    entity: str           # canonical name, as in the KB title
    start: int            # span in the normalised text
    end: int
    weight: float
    exact: bool           # the span is the canonical name itself


class EntityLexicon:
    def __init__(self, entities: list[str], doc_entity: dict[str, str | None],
                 doc_aspect: dict[str, str] | None = None):
        self.entities = entities
        self.doc_entity = doc_entity          # doc_id -> entity (None: tenant-wide document)
        self.doc_aspect = doc_aspect or {}    # doc_id -> aspect (title suffix; a tenant-wide doc's whole title)
        self._norm = {e: normalize(e) for e in entities}
        n_with = Counter(ch for e in entities for ch in set(self._norm[e]))
        n = len(entities)
        self.char_weight = {ch: math.log((n + 1) / (c + 0.5)) for ch, c in n_with.items()}
        self._total = {e: sum(self.char_weight[ch] for ch in self._norm[e]) for e in entities}

    @classmethod
    def from_docs(cls, docs: list[Doc], min_prefixes: int = 3) -> "EntityLexicon":
        titled = [(d, d.title.strip()) for d in docs if d.title and d.title.strip()]
        prefix_titles: Counter = Counter()
        suffix_prefixes: dict[str, set[str]] = defaultdict(set)
        for _, t in titled:
            for i in range(1, len(t)):
                prefix_titles[t[:i]] += 1
                suffix_prefixes[t[i:]].add(t[:i])
        by_entity: dict[str, list[str]] = defaultdict(list)
        doc_aspect = {d.doc_id: t for d, t in titled}
        for d, t in titled:
            # The split whose prefix many titles share and whose suffix follows many prefixes:
            # "考研英语全程班|适合人群与基础要求" (6 x 12) beats "…基础|要求" (1 x 13) and "考研|英语…" (18 x 1).
            best = max(range(2, len(t)), key=lambda i: (prefix_titles[t[:i]] * len(suffix_prefixes[t[i:]]), i),
                       default=None)
            if best is None:
                continue
            prefix, suffix = t[:best].strip(), t[best:]
            if prefix_titles[t[:best]] >= 2 and len(suffix_prefixes[suffix]) >= min_prefixes and len(prefix) >= 2:
                by_entity[prefix].append(d.doc_id)
                doc_aspect[d.doc_id] = suffix
        doc_entity: dict[str, str | None] = {d.doc_id: None for d in docs}
        entities = []
        for e, ids in by_entity.items():
            if len(ids) >= 2:
                entities.append(e)
                doc_entity.update({i: e for i in ids})
            else:
                doc_aspect.update({i: next(t for d, t in titled if d.doc_id == i) for i in ids})
        return cls(sorted(entities, key=lambda e: (-len(e), e)), doc_entity, doc_aspect)

    def to_json(self) -> dict:
        """What the lexicon is made of, to freeze it in a release folder (`from_json` gives it back)."""
        return {"entities": self.entities, "doc_entity": self.doc_entity, "doc_aspect": self.doc_aspect}

    @classmethod
    def from_json(cls, doc: dict) -> "EntityLexicon":
        return cls(list(doc["entities"]), dict(doc["doc_entity"]), dict(doc.get("doc_aspect") or {}))

    # ------------------------------------------------------------------------------------ matching
    def _best_window(self, text: str, entity: str) -> tuple[float, int, int]:
        """(score, start, end) of the window of ``text`` that best matches ``entity``.

        Exact characters match in any order ("B族维生素" ~ "复合维生素B片"); a homophone ("澳" for
        "奥", "几" for "计") only where it continues the previous match in the entity's order, or just
        before the window's first match, so a stray "直" three characters later never counts as "职".
        """
        ent = self._norm[entity]
        w = self.char_weight
        best = (0.0, 0, 0)
        max_len = len(ent) + 2
        for i, ch in enumerate(text):
            if ch not in ent:
                continue
            used = [False] * len(ent)
            score, last = 0.0, None          # last: entity index matched by the previous text character
            for j in range(i, min(len(text), i + max_len)):
                c = text[j]
                k = next((k for k, e in enumerate(ent) if e == c and not used[k]), None)
                if k is None and last is not None and last + 1 < len(ent) and not used[last + 1] \
                        and _sound(c) is not None and _sound(c) == _sound(ent[last + 1]):
                    k = last + 1
                if k is None:
                    score -= UNMATCHED_COST
                    last = None
                    if score <= 0:
                        break
                    continue
                used[k] = True
                score += w[ent[k]] if ent[k] == c else HOMOPHONE_SHARE * w[ent[k]]
                last = k
                if score >= best[0]:  # a later equal window wins: the last mention counts
                    start, first = i, next(k2 for k2, e in enumerate(ent) if e == text[i])
                    bonus = 0.0
                    # One homophone just before the first match ("付酶Q10" for "辅酶Q10").
                    if i > 0 and first > 0 and not used[first - 1] and _sound(text[i - 1]) is not None \
                            and _sound(text[i - 1]) == _sound(ent[first - 1]):
                        start, bonus = i - 1, HOMOPHONE_SHARE * w[ent[first - 1]]
                    if score + bonus >= best[0]:
                        best = (score + bonus, start, j + 1)
        return best

    def _exact(self, span: str, entity: str) -> int:
        left = Counter(self._norm[entity])
        n = 0
        for ch in span:
            if left[ch] > 0:
                left[ch] -= 1
                n += 1
        return n

    def _accept(self, score: float, entity: str, exact_chars: int = 2) -> bool:
        # Two characters at least must match exactly: one character and a homophone ("会寄" for
        # "会计") happen by chance.
        return exact_chars >= 2 and score >= MIN_WEIGHT and \
            (score >= MIN_COVERAGE * self._total[entity] or score >= STRONG_WEIGHT)

    def _resolve(self, text: str) -> tuple[list[Mention], list[set[str]]]:
        """(mentions, ambiguous groups) of ``text``: one pass serves ``mentions`` and ``ambiguous_spans``."""
        t = normalize(text)
        windows = [(*self._best_window(t, e), e) for e in self.entities]
        # Rivals need not pass the acceptance bar: "英语" is as much 大学英语四六级通关班 (too long to accept
        # on two characters) as 考研英语全程班, so it resolves to neither.
        everyone = [(score, e, s, end) for score, s, end, e in windows if score >= MIN_WEIGHT]
        cands = [c for c in everyone if self._accept(c[0], c[1], self._exact(t[c[2]:c[3]], c[1]))]
        cands.sort(key=lambda c: (-c[0], -len(c[1]), c[2]))
        out: list[Mention] = []
        groups: list[set[str]] = []
        taken: list[tuple[int, int, float]] = []
        for score, e, s, end in cands:
            if any(s < x[1] and x[0] < end for x in taken):
                continue
            taken.append((s, end, score))
            rivals = [c for c in everyone if c[1] != e and c[2] < end and s < c[3]]
            if rivals and score - max(c[0] for c in rivals) < AMBIGUITY_MARGIN:
                # Equally good for two entities ("英语" in two course names): resolves to neither.
                tied = {e} | {c[1] for c in rivals if abs(c[0] - score) < AMBIGUITY_MARGIN}
                if tied not in groups:
                    groups.append(tied)
                continue
            out.append(Mention(e, s, end, round(score, 4), t[s:end] == self._norm[e]))
        return sorted(out, key=lambda m: m.start), groups

    def mentions(self, text: str) -> list[Mention]:
        """Entity mentions in ``text`` (normalised), left to right, non-overlapping, unambiguous."""
        return self._resolve(text)[0]

    def ambiguous_spans(self, text: str) -> list[set[str]]:
        """Windows that match several entities equally well: the candidates, for disambiguation by context."""
        return self._resolve(text)[1]

    def last_mentioned(self, text: str) -> str | None:
        """The entity named last in ``text`` ("对比了A和B，最后选了B" → B), or None."""
        ms = self.mentions(text)
        return ms[-1].entity if ms else None
