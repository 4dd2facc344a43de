"""release.json, the file that names what a release folder serves (written by the release stage,
`qrewrite.release.folder`; read by the runtime that answers with it, the eval and the gateway)."""

from __future__ import annotations

from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_json

RELEASE_FILE = "release.json"


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
