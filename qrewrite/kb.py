"""The tenant knowledge base: a JSONL of documents with unique ids (field names mapped by tenants[].kb.fields)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import QrewriteError
from .io_utils import iter_jsonl


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    content: str

    @property
    def text(self) -> str:
        return f"{self.title}\n{self.content}" if self.title else self.content


DEFAULT_FIELDS = {"doc_id": "doc_id", "title": "title", "content": "content"}


def tenant_kb(tenant: dict) -> list[Doc]:
    """The knowledge base of tenant config `tenant`, read with its field mapping (tenants[].kb.fields)."""
    return load_kb(tenant["kb"]["path"], tenant["kb"].get("fields"))


def load_kb(path: str | Path, fields: dict | None = None) -> list[Doc]:
    """Documents of the JSONL at `path`; `fields` maps doc_id / title / content to the file's own field names."""
    fields = {**DEFAULT_FIELDS, **(fields or {})}
    f_id, f_title, f_content = fields["doc_id"], fields["title"], fields["content"]
    path = Path(path)
    if not path.exists():
        raise QrewriteError("knowledge base not found", file=str(path),
                            hint="set tenants[].kb.path in config.yaml")
    docs: list[Doc] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path, utf8_hint="save the knowledge base as UTF-8 (e.g. iconv -f GBK -t UTF-8)",
                                  json_hint="each line must be one JSON object"):
        if not isinstance(obj, dict):
            raise QrewriteError("line is not a JSON object", file=str(path), row=lineno,
                                hint=f"each line must be one JSON object with {f_id}, {f_title}, {f_content}")
        for role, key in (("doc_id", f_id), ("content", f_content)):
            if key not in obj:
                raise QrewriteError(f"missing field {key!r} ({role}); fields found: {list(obj)}", file=str(path),
                                    row=lineno, column=key, hint=f"set tenants[].kb.fields.{role} in config.yaml to the KB's "
                                    f"field name, e.g. kb: {{fields: {{doc_id: id, title: title, content: text}}}}")
            if not isinstance(obj[key], (str, int)) or not str(obj[key]).strip():
                raise QrewriteError(f"empty or non-text field {key!r} ({role})", file=str(path), row=lineno,
                                    column=key, hint=f"every document needs a non-empty {role}")
        doc_id = str(obj[f_id]).strip()
        if doc_id in seen:
            raise QrewriteError(f"duplicate doc_id {doc_id!r} (first seen on row {seen[doc_id]})",
                                file=str(path), row=lineno, column=f_id,
                                hint="document ids must be unique within a knowledge base")
        seen[doc_id] = lineno
        title = str(obj.get(f_title) or "") if f_title else ""
        docs.append(Doc(doc_id, title, str(obj[f_content])))
    if not docs:
        raise QrewriteError("knowledge base is empty", file=str(path))
    return docs
