"""models/T/release: what the tenant gets. `release.json` names it (a model with its decoding, or a rule) with
every candidate's validation figures; a released model's files are linked in beside it (hard links: no second
copy of the weights), so the folder serves as it is. Written whole or not at all (io_utils.atomic_dir)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import atomic_dir, read_json, write_json
from ..lineage.document import LINEAGE_FILE

log = logging.getLogger(__name__)

RELEASE_FILE = "release.json"
# what each rule sends to the RAG service in place of a model's rewrite
RULE_TEXT = {"raw": "the user's query as it is", "query_history": "the user's query with the history summary "
                                                                  "pasted after it"}


# Snakemake's marker of when a directory output was finished: a hard link to the model's would be touched when the
# release's own is, making the model look newer than RL and the release, and the next run retrain RL (seen
# 2026-12-04: `make durdev` twice reran rl)
WORKFLOW_MARKERS = (".snakemake_timestamp",)


def _link_model(src: Path, dst: Path) -> str:
    """Link (else copy) every file of model folder `src` into `dst`, its lineage.json (the release's own lineage
    chains to it) and the workflow's markers left out. Returns how."""
    how = "hard links"
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or rel.as_posix() == LINEAGE_FILE or f.name in WORKFLOW_MARKERS:
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, dst / rel)
        except OSError:  # another file system: a copy, said in release.json
            shutil.copy2(f, dst / rel)
            how = "copies"
    return how


def write_release(out: str, doc: dict, model_dir: str | None) -> None:
    """models/T/release: release.json, and the released model's files when it is a model."""
    with atomic_dir(out) as tmp:
        if model_dir is not None:
            doc = {**doc, "released": {**doc["released"], "files": _link_model(Path(model_dir), tmp)}}
        write_json(tmp / RELEASE_FILE, doc)


def load_release(folder: str) -> dict:
    """release.json of a release folder; an error that says how to make it."""
    path = Path(folder) / RELEASE_FILE
    if not path.is_file():
        raise QrewriteError(f"no {RELEASE_FILE} in the release folder", file=str(folder),
                            hint="the release stage writes it: snakemake models (or qrewrite release)")
    doc = read_json(path)
    if doc.get("released", {}).get("kind") not in ("model", "rule"):
        raise QrewriteError(f"{RELEASE_FILE} names no released model or rule", file=str(path),
                            hint="rerun the release stage")
    return doc
