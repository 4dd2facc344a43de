"""models/T/release: what the tenant gets. `release.json` names it (a model with its decoding, or a rule) with
every candidate's validation figures; a released model's files are linked in beside it (hard links: no second
copy of the weights), so the folder serves as it is. Written whole or not at all (io_utils.atomic_dir)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..io_utils import atomic_dir, write_json
from ..lineage.document import LINEAGE_FILE
from ..runtime.release_file import RELEASE_FILE

log = logging.getLogger(__name__)

# what each rule sends to the RAG service in place of a model's rewrite
RULE_TEXT = {"raw": "the user's query as it is",
             "query_history": "the user's query with the history summary pasted after it",
             "resolve": "the user's query with its referent resolved over the tenant's entity lexicon (the embedded "
                        "teacher; the lexicon frozen beside release.json)"}


# Snakemake's marker of when a directory output was finished: a hard link to the model's would be touched when the
# release's own is, making the model look newer than RL and the release, and the next run retrain RL
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


def write_release(out: str, doc: dict, model_dir: str | None, state: dict[str, object] | None = None) -> None:
    """models/T/release: release.json, and the released model's files when it is a model, or a rule's state
    (file name → JSON) when it has one."""
    with atomic_dir(out) as tmp:
        for name, content in (state or {}).items():
            write_json(tmp / name, content)
        if model_dir is not None:
            doc = {**doc, "released": {**doc["released"], "files": _link_model(Path(model_dir), tmp)}}
        write_json(tmp / RELEASE_FILE, doc)
