"""Names matched against synonyms: the sheet's header names (qrewrite/onboard/columns.py) and the KB's key names
(qrewrite/onboard/kb_fields.py), compared without case, spaces or punctuation ("Doc IDs" = "docids")."""

from __future__ import annotations

import re
import unicodedata


def _key(text: str) -> str:
    """A header or field name as names are compared: NFKC, lower case, no spaces, punctuation or underscores."""
    return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", text or "").lower())


# A header ending so names ids ("user_id", "用户编号"): it reads as no text field, whatever synonym it holds.
_ID_SUFFIX = re.compile(r"(ids?|编号|序号)$")


def name_score(name: str, synonyms, ids: bool = False) -> tuple[int, float, int] | None:
    """How well `name` reads as one of `synonyms`: (2, 1.0, -rank) for equal, (1, share of the name the synonym
    covers, -rank) for a synonym inside it (not in a name of ids unless `ids`), None for neither; rank: the
    synonym's place in `synonyms` (earlier ones win ties)."""
    key = _key(name)
    if not key:
        return None
    best = None
    for rank, syn in enumerate(synonyms):
        s = _key(syn)
        if s == key:
            score = (2, 1.0, -rank)
        elif s and s in key and (ids or not _ID_SUFFIX.search(key)):
            score = (1, len(s) / len(key), -rank)
        else:
            continue
        if best is None or score > best:
            best = score
    return best


def match_names(names: list[str], synonyms: dict, ids: tuple[str, ...] = ("gold", "doc_id")) -> dict[str, int]:
    """Field -> index into `names`, each name for one field at most, the best-scoring pairs first (fields in
    `ids` hold ids, so a name of ids may read as them)."""
    pairs = sorted(((score, -i, field) for field, syns in synonyms.items() for i, n in enumerate(names)
                    if (score := name_score(n, syns, field in ids))), reverse=True)
    out: dict[str, int] = {}
    for _, neg_i, field in pairs:
        if field not in out and -neg_i not in out.values():
            out[field] = -neg_i
    return out
