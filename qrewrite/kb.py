"""The tenant knowledge base: a JSONL of documents with unique ids."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import QrewriteError


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    content: str

    @property
    def text(self) -> str:
        return f"{self.title}\n{self.content}" if self.title else self.content


def load_kb(path: str | Path) -> list[Doc]:
    path = Path(path)
    if not path.exists():
        raise QrewriteError("knowledge base not found", file=str(path),
                            hint="set tenants[].kb.path in config.yaml")
    docs: list[Doc] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise QrewriteError(f"not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start} of the line)",
                                    file=str(path), row=lineno,
                                    hint="save the knowledge base as UTF-8 (e.g. iconv -f GBK -t UTF-8)") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QrewriteError(f"invalid JSON ({exc.msg})", file=str(path), row=lineno,
                                    hint="each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise QrewriteError("line is not a JSON object", file=str(path), row=lineno,
                                    hint="each line must be one JSON object with doc_id, title, content")
            for key in ("doc_id", "content"):
                if not isinstance(obj.get(key), str) or not obj[key].strip():
                    raise QrewriteError("missing or empty field", file=str(path), row=lineno, column=key,
                                        hint="every document needs a non-empty doc_id and content")
            doc_id = obj["doc_id"].strip()
            if doc_id in seen:
                raise QrewriteError(f"duplicate doc_id {doc_id!r} (first seen on row {seen[doc_id]})",
                                    file=str(path), row=lineno, column="doc_id",
                                    hint="document ids must be unique within a knowledge base")
            seen[doc_id] = lineno
            docs.append(Doc(doc_id, str(obj.get("title") or ""), obj["content"]))
    if not docs:
        raise QrewriteError("knowledge base is empty", file=str(path))
    return docs
