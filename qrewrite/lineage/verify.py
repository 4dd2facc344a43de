"""`qrewrite lineage verify`: recompute every hash a lineage file records and report what no longer matches.

`verify_lineage` returns the mismatches, first upstream first, following chained lineage files of input models
recursively; only when every hash matches does it check the row-level links of the training samples.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_jsonl, sha256_file
from .container import image_digest
from .document import changed_files, load_lineage, model_files
from .hashing import hash_path


def _check(entry: dict, root: Path) -> str | None:
    p = root / entry["path"]
    try:
        kind, digest = hash_path(p)
    except QrewriteError:
        return "missing"
    if kind != entry["type"]:
        return f"was a {entry['type']}, is a {kind}"
    return None if digest == entry["sha256"] else f"sha256 {digest[:12]}… != recorded {entry['sha256'][:12]}…"


def _check_image(doc: dict, root: Path) -> tuple[str, str] | None:
    """A model made in a container: the image its rule names now (the recorded config's `containers:` entry
    of its env) must be the image it ran in. A model made on the host records no image: nothing to check."""
    env = doc.get("env") or {}
    ran, rule = env.get("container"), doc["model"]["rule"]
    if not ran:
        return None
    named = ((doc.get("config") or {}).get("containers") or {}).get(env.get("name"))
    if not named:
        return f"containers.{env.get('name')}", f"rule {rule} ran in image {ran['digest']}, and the config names none"
    try:
        digest = image_digest(named, root)
    except QrewriteError as exc:
        return named, f"rule {rule} ran in image {ran['digest'][:19]}…, which cannot be checked here: {exc}"
    if digest != ran["digest"]:
        return named, (f"rule {rule} ran in image {ran['digest'][:19]}… ({ran['runtime']} {ran['image']}), "
                       f"but the image it names is {digest[:19]}…")
    return None


def _check_samples(doc: dict, root: Path) -> list[tuple[str, str]]:
    """Row-level links of every SFT sample: query id → queries.jsonl row (same raw row) → teacher call."""
    problems = []
    for split, spec in (doc.get("samples") or {}).items():
        try:
            queries = {row["id"]: row for row in read_jsonl(root / spec["queries"])}
            teacher = {t["id"]: t for t in read_jsonl(root / spec["teacher"])}
            rows = read_jsonl(root / spec["path"])
        except QrewriteError as exc:
            problems.append((spec["path"], str(exc)))
            continue
        for i, s in enumerate(rows, 1):
            meta = s.get("meta") or {}
            if not meta.get("trainable", True):  # a validation row the teacher failed on: measured, never learnt
                continue
            qid = meta.get("query_id")
            query_row, t = queries.get(qid), teacher.get(qid)
            where = f"{spec['path']} line {i} (query {qid})"
            if query_row is None:
                problems.append((where, f"query id not in {spec['queries']}"))
            elif query_row.get("row") != meta.get("raw_row"):
                problems.append((where, f"raw_row {meta.get('raw_row')} but {spec['queries']} says row {query_row.get('row')}"))
            elif t is None or t.get("call_key") != meta.get("teacher_call_key") or t.get("status") != "ok":
                problems.append((where, f"teacher call {str(meta.get('teacher_call_key'))[:12]}… not an ok row "
                                        f"of {spec['teacher']}"))
            if problems:
                break
    return problems


def verify_lineage(model_dir: str | os.PathLike, _seen: set | None = None) -> list[tuple[str, str]]:
    """Recompute every hash; [(artifact, problem)], most upstream first; [] if everything matches."""
    seen = _seen if _seen is not None else set()
    doc, root = load_lineage(model_dir)
    problems: list[tuple[str, str]] = []
    for entry in doc["upstream"]:
        why = _check(entry, root)
        if why:
            problems.append((entry["path"], why))
    for name, entry in doc["inputs"].items():
        if entry.get("in_image") and not (root / entry["path"]).exists():
            continue  # a file of the image the model was made in: checked through the image's digest below
        if entry["path"] not in {e["path"] for e in doc["upstream"]}:
            why = _check(entry, root)
            if why:
                problems.append((entry["path"], why))
    for ch in doc["chained"]:
        lin = root / ch["path"]
        if not lin.is_file():
            problems.append((ch["path"], "missing"))
            continue
        if sha256_file(lin) != ch["sha256"]:
            problems.append((ch["path"], "chained lineage file changed"))
        key = str(lin.resolve())
        if key not in seen:
            seen.add(key)
            problems += [(p, f"{why} (via {ch['path']})") for p, why in verify_lineage(lin.parent, seen)]
    mdir = root / doc["model"]["dir"]
    files = model_files(mdir) if mdir.is_dir() else {}
    changed = changed_files(files, doc["model"]["files"])
    if changed:
        problems.append((f"{doc['model']['dir']}/{changed[0]}",
                         "model file changed, added or removed"))
    image = _check_image(doc, root)
    if image:
        problems.append(image)
    if not problems:
        problems += _check_samples(doc, root)
    # first upstream first, each artifact once
    out, named = [], set()
    for p, why in problems:
        if p not in named:
            named.add(p)
            out.append((p, why))
    return out
