"""The KB's fields (tenants[].kb.fields): key names of the JSONL's first lines against synonyms, else their values
(the id: unique short strings or integers; the content: the longest text)."""

from __future__ import annotations

from pathlib import Path

from ..errors import QrewriteError
from .names import match_names

MAX_ID_CHARS = 64         # a document id is short
FIELD_SYNONYMS = {
    "doc_id": ("id", "doc_id", "_id", "文档id", "docid", "document id", "文档编号"),
    "title": ("title", "name", "标题", "名称", "heading"),
    "content": ("content", "text", "body", "正文", "内容", "passage", "contents"),
}


def _field_values(objs: list[dict], key: str) -> list:
    return [o[key] for o in objs if key in o]


def is_id_field(objs: list[dict], key: str) -> bool:
    """Every object has it, as a short non-empty string or an integer, each value once."""
    values = _field_values(objs, key)
    texts = [str(v).strip() for v in values if isinstance(v, (str, int)) and not isinstance(v, bool)]
    return (len(values) == len(objs) and len(texts) == len(values) and all(texts)
            and len(set(texts)) == len(texts) and max(map(len, texts)) <= MAX_ID_CHARS)


def mean_text_len(objs: list[dict], key: str) -> float:
    """Mean length of the key's string values (0 when it has none)."""
    texts = [v for v in _field_values(objs, key) if isinstance(v, str)]
    return sum(map(len, texts)) / len(texts) if texts else 0.0


def pick_id_field(objs: list[dict], keys: list[str], named: dict) -> tuple[str | None, str]:
    """(key, evidence) of the documents' id: the key named so when its values are ids, else the first key whose
    values are (unique short strings or integers in every line), else the named key all the same (load_kb then
    says what is wrong with it: a repeated or empty id, on its line)."""
    n = len(objs)
    name = keys[named["doc_id"]] if "doc_id" in named else None
    if name is not None and is_id_field(objs, name):
        return name, f"key name; {n} unique values in the first {n} lines"
    others = [k for k in keys if k not in (keys[i] for i in named.values()) and is_id_field(objs, k)]
    if others:
        return others[0], f"values: unique short strings or integers in all of the first {n} lines"
    return name, "key name (its values are not unique short ids: see the KB check)"


def pick_title_field(objs: list[dict], keys: list[str], named: dict, doc_id: str) -> tuple[str | None, str]:
    name = keys[named["title"]] if "title" in named else None
    if name is not None and name != doc_id and mean_text_len(objs, name):
        return name, f"key name; mean {mean_text_len(objs, name):.0f} characters"
    return None, "no key reads as a title"


def pick_content_field(objs: list[dict], keys: list[str], named: dict, exclude: tuple) -> tuple[str | None, str]:
    """(key, evidence) of the document text: the key named so when it holds text, else the longest text."""
    name = keys[named["content"]] if "content" in named else None
    if name is not None and mean_text_len(objs, name):
        return name, f"key name; mean {mean_text_len(objs, name):.0f} characters"
    texts = [(mean_text_len(objs, k), k) for k in keys if k not in exclude and mean_text_len(objs, k)]
    if not texts:
        return None, ""
    length, key = max(texts)
    return key, f"values: the longest text (mean {length:.0f} characters)"


def propose_kb_fields(objs: list[dict], path: Path) -> tuple[dict, dict]:
    """(fields, evidence): tenants[].kb.fields by key names, else by values (the id: unique short strings or
    integers; the content: the longest text); title None when no key is named so. A KB without an id or a
    content field is a QrewriteError naming the file and the keys found."""
    keys = list(dict.fromkeys(k for o in objs for k in o))
    named = match_names(keys, FIELD_SYNONYMS)
    doc_id, id_why = pick_id_field(objs, keys, named)
    if doc_id is None:
        raise QrewriteError(f"no field reads as the document id; fields found: {keys}", file=str(path), row=1,
                            hint="every document needs a unique id (the ids the sheet's gold column cites), under "
                                 "a key such as id or doc_id")
    title, title_why = pick_title_field(objs, keys, named, doc_id)
    content, content_why = pick_content_field(objs, keys, named, (doc_id, title))
    if content is None:
        raise QrewriteError(f"no field holds the document text; fields found: {keys}", file=str(path), row=1,
                            hint="every document needs its text under a key such as content or text")
    return ({"doc_id": doc_id, "title": title, "content": content},
            {"doc_id": id_why, "title": title_why, "content": content_why})
