"""The lineage file: `lineage.json` in a model directory, its format, and reading it back.

A lineage file records, for one model directory:

* `inputs`: the rule's direct inputs with their sha256 (`qrewrite.lineage.hashing`); an input that is itself
  a model directory with a lineage.json is *chained* (`chained`: that lineage file's path and sha256,
  verified recursively);
* `upstream`: every artifact back to the raw Excel (and the demo source it is built from), each with its
  sha256 and the rule + inputs that made it, walked through the stage table (`qrewrite.workflow.stages.upstream`);
* `model`: the model directory's own files and their sha256 (lineage.json itself excluded);
* `env.container`: the image the rule ran in (runtime, reference, sha256 digest; null on the host), which
  `verify` compares with the image the rule names now (`qrewrite.lineage.container`); an input that is one of
  that image's own files (`in_image`, e.g. the GGUF inside the pinned package) is checked through that digest;
* `samples`: row-level provenance of the training data: every SFT sample's `meta` names its query id, raw
  Excel row and teacher call key; `verify` checks each link against queries.jsonl and teacher.jsonl;
* the rule, its exact params, the validated config (secret-looking values stripped), code version (git
  commit + dirty flag), environment (hashes of the pinned requirements and the container definition),
  teacher / judge provider and model, tokens and cost spent, start / end time, host, Slurm job id.

Paths are stored relative to the project root (the directory the pipeline runs in); `load_lineage` finds the
root from the model directory's recorded path, so `verify` and `show` work from any working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_json
from .hashing import dir_files

FORMAT = "qrewrite-lineage/1"
LINEAGE_FILE = "lineage.json"


def model_files(model_dir: Path) -> dict[str, str]:
    """The model directory's own files and their sha256, lineage.json excluded (it is written after them)."""
    return dir_files(model_dir, exclude_top=(LINEAGE_FILE,))


def changed_files(files: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """The names whose sha256 differs between `files` and `recorded`, or that only one of them has, sorted."""
    return sorted(set(files) ^ set(recorded) | {f for f in files if f in recorded and files[f] != recorded[f]})


def load_lineage(model_dir: str | os.PathLike) -> tuple[dict, Path]:
    """(lineage document, project root) for `model_dir`."""
    path = Path(model_dir) / LINEAGE_FILE
    if not path.is_file():
        raise QrewriteError(f"no {LINEAGE_FILE} in the model directory", file=str(model_dir),
                            hint="lineage is written by the rule that makes the model; rerun it")
    try:
        doc = read_json(path)
    except ValueError as exc:
        raise QrewriteError(f"not valid JSON: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise QrewriteError(f"not a {FORMAT} document", file=str(path))
    return doc, project_root(model_dir, doc["model"]["dir"])


def project_root(model_dir: str | os.PathLike, recorded: str) -> Path:
    """The directory the recorded relative paths are relative to: `model_dir` minus the recorded dir."""
    here = Path(model_dir).resolve()
    rec = Path(recorded)
    if rec.is_absolute():
        return Path("/")
    parts = rec.parts
    if tuple(here.parts[-len(parts):]) != parts:
        return Path.cwd()  # moved or renamed: paths are taken relative to the working directory
    return here.parents[len(parts) - 1]
