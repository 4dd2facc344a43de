"""The proposed tenant block (tenants[] of qrewrite/schemas/config.schema.yaml) and its text: one line a key, the
evidence as end-of-line comments, checked to read back as the block."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import QrewriteError

TOP1 = 0.1                # tenants[].thresholds.top1 (the schema default, written out)
SYSTEM_PROMPTS = {
    "zh": "你是 {name} 知识库的检索查询改写助手。把用户问题改写成完整独立的检索查询：补全指代，纠正错别字，保留所问的方面。"
          "只输出改写后的查询。",
    "en": "You rewrite search queries for the {name} knowledge base. Rewrite the user question into a complete, "
          "self-contained search query; resolve references, fix typos and keep the aspect asked about. Output only "
          "the rewritten query.",
}
TENANT_KEYS = ("name", "language", "system_prompt", "raw_excel", "sheet", "columns", "kb", "thresholds", "teacher",
               "student")


def system_prompt(name: str, language: str) -> str:
    return SYSTEM_PROMPTS[language].format(name=name)


def project_path(path: Path, root: Path) -> str:
    """`path` as config.yaml names it: relative to the project root (the config file's folder) when inside it."""
    p = path.resolve()
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


def tenant_entry(name: str, *, language: str, raw_excel: str, sheet: str | None, columns: dict, kb_path: str,
                 fields: dict, teacher: str) -> dict:
    """The tenant block, keys in README order (tenants[] of qrewrite/schemas/config.schema.yaml)."""
    return {"name": name, "language": language, "system_prompt": system_prompt(name, language),
            "raw_excel": raw_excel, "sheet": sheet, "columns": dict(columns),
            "kb": {"path": kb_path, "name": f"{name}_kb", "fields": dict(fields)},
            "thresholds": {"top1": TOP1}, "teacher": {"provider": teacher}, "student": "auto"}


def _flow(value) -> str:
    """`value` as one line of YAML (a scalar, or a mapping in flow style), quoted where YAML needs it."""
    text = yaml.safe_dump(value, allow_unicode=True, default_flow_style=True, width=10 ** 6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def tenant_yaml(tenant: dict, indent: int = 2, notes: dict | None = None) -> str:
    """The tenant as a `tenants:` list item indented by `indent`, one line a key (kb on its own lines),
    `notes` as end-of-line comments."""
    notes = notes or {}
    pad, key_pad = " " * indent, " " * (indent + 2)

    def line(prefix: str, key: str, value) -> str:
        note = f"   # {notes[key]}" if notes.get(key) else ""
        return f"{prefix}{key}: {_flow(value)}{note}"

    lines = [line(f"{pad}- ", "name", tenant["name"])]
    for key in TENANT_KEYS[1:]:
        if key == "kb":
            lines.append(f"{key_pad}kb:")
            lines += [line(key_pad + "  ", k, tenant["kb"][k]) for k in ("path", "name", "fields")]
        else:
            lines.append(line(key_pad, key, tenant[key]))
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != [tenant]:  # the text must read back as the block, whatever the values hold
        raise QrewriteError(f"the tenant block of {tenant['name']} does not read back as written",
                            hint="report this with the sheet's header names")
    return text
