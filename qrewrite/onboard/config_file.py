"""The tenant block added to the config file's `tenants:` list as text, so the file's comments stay; refused when
the name is there, put back when the file no longer loads."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import QrewriteError
from .block import tenant_yaml


def existing_tenants(config_path: Path) -> list[str]:
    from ..config import _read_raw

    raw = _read_raw(config_path)
    return [t.get("name") for t in raw.get("tenants") or [] if isinstance(t, dict)]


def refuse_existing(config_path: Path, name: str) -> None:
    if name in existing_tenants(config_path):
        raise QrewriteError(f"a tenant named {name!r} is already in the config: nothing written", file=str(config_path),
                            hint=f"pick another name, or edit tenant {name}'s entry by hand")


def _unrecognised(path: str, why: str) -> QrewriteError:
    return QrewriteError(f"cannot add the tenant: {why}; nothing written", file=path,
                         hint="paste the printed block under `tenants:` by hand")


def insert_tenant(text: str, tenant: dict, source: str, notes: dict | None = None) -> str:
    """`text` (a config file) with `tenant` appended to its `tenants:` block list as text: after the last entry,
    before the comments and blank lines that lead into the next top-level key, indented like the entries. The
    comments stay where they were. A QrewriteError when the file's layout is not a `tenants:` block list."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if re.fullmatch(r"tenants:[ \t]*(#.*)?", ln.rstrip("\r\n"))]
    if len(starts) != 1:
        raise _unrecognised(source, "no `tenants:` line of its own at the top level" if not starts else
                            "`tenants:` appears more than once")
    start = starts[0]

    def top_level_key(ln: str) -> bool:
        return bool(ln.strip()) and ln[0] not in " \t#-"

    end = next((i for i in range(start + 1, len(lines)) if top_level_key(lines[i])), len(lines))
    entries = [ln for ln in lines[start + 1:end] if re.match(r"[ ]*- ", ln)]
    if not entries:
        raise _unrecognised(source, "the `tenants:` list has no `- name: ...` entries in block style")
    indent = len(entries[0]) - len(entries[0].lstrip(" "))
    at = end
    while at > start + 1 and (not lines[at - 1].strip() or lines[at - 1].startswith("#")):
        at -= 1  # blank lines and column-0 comments just above the next key belong to it
    nl = "\r\n" if "\r\n" in text else "\n"
    head = lines[:at]
    if head and not head[-1].endswith("\n"):
        head[-1] += nl
    new = "".join(head + [nl, tenant_yaml(tenant, indent, notes).replace("\n", nl)] + lines[at:])
    if not _appended(text, new, tenant):
        raise _unrecognised(source, "the `tenants:` list does not end where its indentation says")
    return new


def _appended(old: str, new: str, tenant: dict) -> bool:
    """Whether config text `new` reads as `old` with `tenant` after its last tenant and nothing else changed."""
    try:
        before, after = yaml.safe_load(old), yaml.safe_load(new)
    except yaml.YAMLError:
        return False
    if not (isinstance(before, dict) and isinstance(after, dict) and isinstance(before.get("tenants"), list)):
        return False
    rest = lambda cfg: {k: v for k, v in cfg.items() if k != "tenants"}  # noqa: E731
    return after.get("tenants") == before["tenants"] + [tenant] and rest(after) == rest(before)


def append_tenant(config_path: Path, tenant: dict, notes: dict | None = None) -> None:
    """Append `tenant` to the config file's tenants (comments kept), atomically; the file must then load
    (qrewrite.config.load_config), else the old file is put back and the error raised."""
    from ..config import load_config
    from ..io_utils import write_text_atomic

    refuse_existing(config_path, tenant["name"])
    old = config_path.read_text(encoding="utf-8")
    new = insert_tenant(old, tenant, str(config_path), notes)
    write_text_atomic(config_path, new)
    try:
        load_config(config_path)
    except QrewriteError as exc:
        write_text_atomic(config_path, old)
        raise QrewriteError(f"with tenant {tenant['name']} added the config does not validate, so it was left as it "
                            f"was: {exc}", file=str(config_path)) from None
