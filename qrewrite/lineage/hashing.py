"""Content hashes of the artifacts a lineage file records.

A file hashes as its sha256; a directory as the sha256 of the sorted list of its files' relative paths and
sha256s, so the digest changes when any file is changed, added, removed or renamed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import sha256_file

# Bookkeeping files that are not content: Snakemake touches .snakemake_timestamp in a directory output after
# the job (i.e. after lineage.json was written) and again on `--touch`.
NOT_CONTENT = frozenset({".snakemake_timestamp"})


def dir_files(path: Path, exclude_top: tuple[str, ...] = ()) -> dict[str, str]:
    """relative path → sha256 for every regular file under `path` (symlinks: 'link:' + target)."""
    out = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name in NOT_CONTENT:
                continue
            full = Path(root) / name
            rel = full.relative_to(path).as_posix()
            if rel in exclude_top:
                continue
            out[rel] = "link:" + os.readlink(full) if full.is_symlink() else sha256_file(full)
    return out


def files_digest(files: dict[str, str]) -> str:
    """One sha256 over a relative path → sha256 listing (`dir_files`): the directory's digest."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]}\n".encode("utf-8"))
    return h.hexdigest()


def hash_path(path: str | os.PathLike) -> tuple[str, str]:
    """(type, sha256) of a file or directory; raises QrewriteError if it does not exist."""
    p = Path(path)
    if p.is_file():
        return "file", sha256_file(p)
    if p.is_dir():
        return "dir", files_digest(dir_files(p))
    raise QrewriteError("artifact not found", file=str(path), hint="run the stage that produces it first")
