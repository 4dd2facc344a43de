"""Referent resolution over the tenant's entity lexicon: the question a person would write once they know what
the user means. A loosely named product or course becomes its KB name; a question that names none gets the one the
history names last, else the profile's. It needs no model and no paid call, so it is the embedded teacher
(qrewrite/teacher/resolve.py) and, where that is the tenant's teacher, a rule a release can be
(qrewrite/runtime/rules.py, with the lexicon frozen in the release folder).
"""

from __future__ import annotations

import re
import unicodedata

from .entities import EntityLexicon

# Pronoun phrases that stand for the entity; longest first so "这个课程" wins over "这个".
_PRONOUN = re.compile(
    r"(这|那|该|此)(个|款|种|门|份|瓶|盒|套)?(产品|商品|东西|保健品|药|课程|课|班|网课)|"
    r"(这|那|该|此)(个|款|种|门|瓶|盒|套)|它们?|这(?=[能可要是有会])")
# Discourse openers that only make sense after the previous turn.
_OPENER = re.compile(r"^(那么|那|所以|然后|还有|另外|那请问|请问)[,，\s]*")


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFKC", text or "")
    return re.sub(r"\s+", " ", text).strip()


class Resolver:
    """rewrite(query, profile, history) → the query with its referent resolved."""

    def __init__(self, lexicon: EntityLexicon):
        self.lexicon = lexicon

    def context_entity(self, profile: str, history: str) -> str | None:
        """The entity the conversation is about: the history's last-named, else the profile's."""
        return self.lexicon.last_mentioned(history or "") or self.lexicon.last_mentioned(profile or "")

    def rewrite(self, query: str, profile: str, history: str) -> str:
        text = _clean(query)
        if len(text.lower()) != len(text):   # spans are found on the lower-cased text
            text = text.lower()
        mentions = self.lexicon.mentions(text)
        if mentions:
            out, pos = [], 0
            for m in mentions:
                out += [text[pos:m.start], m.entity]
                pos = m.end
            return "".join(out + [text[pos:]]).strip()
        entity = self.context_entity(profile, history)
        if entity is None:
            return text
        ambiguous = [g for g in self.lexicon.ambiguous_spans(text) if entity in g]
        if ambiguous:
            # The question names the entity ambiguously ("英语"): the context says which one it is.
            return fill_referent(text, entity, lexicon=self.lexicon)
        return fill_referent(text, entity)


def fill_referent(query: str, entity: str, lexicon: EntityLexicon | None = None) -> str:
    """``query`` with ``entity`` written in: over an ambiguous mention (with ``lexicon``), else over
    the first pronoun phrase, else in front (after dropping a discourse opener such as "那")."""
    text = _clean(query)
    if lexicon is not None:
        low = text.lower()
        score, s, e = lexicon._best_window(low, entity)
        if score > 0 and len(low) == len(text):
            return (text[:s] + entity + text[e:]).strip()
    body = _OPENER.sub("", text) or text
    m = _PRONOUN.search(body)
    if m:
        return (body[:m.start()] + entity + body[m.end():]).strip()
    return f"{entity}{body}"
