"""The artifacts a model derives from: the walk back to the raw Excel through the stage table
(`qrewrite.workflow.stages.upstream`: which stage makes each artifact, from which)."""

from __future__ import annotations

import os
from pathlib import Path

from ..paths import BASE_MODEL, BASE_MODEL_KEY, OPTIONAL_FILES, artifact_paths
from ..lineage.document import LINEAGE_FILE
from ..lineage.hashing import hash_path
from .stages import upstream


def artifact_entry(key: str | None, path: str) -> dict:
    """One artifact as recorded: key (None for a path the pipeline does not make), path, type, sha256, and
    `lineage` when it is a model directory with a lineage file of its own (that chain is verified too)."""
    kind, digest = hash_path(path)
    entry = {"key": key, "path": path, "type": kind, "sha256": digest}
    lin = Path(path) / LINEAGE_FILE
    if kind == "dir" and lin.is_file():
        entry["lineage"] = lin.as_posix()
    return entry


def upstream_closure(tenant_cfg: dict | None, start_keys: list[str]) -> list[dict]:
    """Every artifact that `start_keys` derive from (themselves included), most upstream first.

    Each entry: key, path, type, sha256 and `made_by` ({rule, inputs: [keys]}) when a pipeline rule makes it.
    """
    if tenant_cfg is None:
        return []
    paths = artifact_paths(tenant_cfg)
    order: list[str] = []
    seen: set[str] = set()

    def visit(key: str) -> None:
        if key in seen:
            return
        seen.add(key)
        rule = upstream().get(key)
        if _made_here(rule, paths):
            for dep in rule[1]:
                if dep in paths:
                    visit(dep)
        order.append(key)

    for k in start_keys:
        visit(k)
    out = []
    for key in order:
        if key not in paths:
            continue
        entry = artifact_entry(key, paths[key])
        rule = upstream().get(key)
        if _made_here(rule, paths):
            entry["made_by"] = {"rule": rule[0], "inputs": [k for k in rule[1] if k in paths]}
        out.append(entry)
    return out


def _made_here(rule: tuple | None, paths: dict) -> bool:
    """Whether a pipeline rule makes the artifact for this tenant: every required input exists (a tenant without
    demo_source supplies its raw Excel; a missing gold or red-team set is simply not an input)."""
    return bool(rule) and all(k in paths for k in rule[1] if k not in OPTIONAL_FILES)


def artifact_key(path: str, tenant_cfg: dict | None) -> str | None:
    """The `qrewrite.paths` key of `path`, None if it is not a pipeline artifact; without a tenant only the
    base model can be one."""
    if tenant_cfg is None:
        return BASE_MODEL_KEY if os.path.normpath(path) == os.path.normpath(BASE_MODEL) else None
    for key, p in artifact_paths(tenant_cfg).items():
        if os.path.normpath(p) == os.path.normpath(path):
            return key
    return None
