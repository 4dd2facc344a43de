"""Atomic file writes and JSONL helpers: an output is either complete or absent."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator


_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `path`; on success fsync and rename it over `path`.

    On any exception the temp file is removed, so a crash never leaves a half-written output
    that Snakemake or DVC could mistake for a finished one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual mode
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False) + "\n")


# Valid JSON, but str.splitlines() (and some JSONL readers) treat these as line breaks: escape them.
_LINE_SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False).translate(_LINE_SEPARATORS) + "\n")
            n += 1
    return n


def iter_jsonl(path: str | os.PathLike, utf8_hint: str = "save the file as UTF-8",
               json_hint: str | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; bad UTF-8 or JSON stops with file and row."""
    from .errors import QrewriteError

    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise QrewriteError(f"not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start} of the line)",
                                    file=str(path), row=lineno, hint=utf8_hint) from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise QrewriteError(f"invalid JSON ({exc.msg})", file=str(path), row=lineno, hint=json_hint) from None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    from .errors import QrewriteError

    if not Path(path).is_file():
        raise QrewriteError("input file not found", file=str(path), hint="run the stage that produces it first")
    return [obj for _, obj in iter_jsonl(path)]


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-able object with a canonical encoding (sorted keys, no whitespace)."""
    blob = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def publish_changed(stage: str | os.PathLike, out: str | os.PathLike) -> list[str]:
    """Move each file of folder `stage` over its namesake in `out` (same filesystem), except where the bytes are
    the same: a file left as it was keeps its mtime, so a tenant's data written again does not make Snakemake redo
    its pipeline (retrain SFT on every call). Returns the names left unchanged."""
    kept = []
    for f in sorted(Path(stage).iterdir()):
        dst = Path(out) / f.name
        if dst.is_file() and dst.read_bytes() == f.read_bytes():
            kept.append(f.name)
        else:
            os.replace(f, dst)
    return kept


def write_tar_gz(dest: str | os.PathLike, members: dict[str, Path | bytes]) -> None:
    """Atomically write a gzipped tar of `members` (arcname -> a file, a folder taken whole, or bytes), in arcname
    order with mtime 0 and mode 644 throughout: the same contents make the same archive, byte for byte."""
    import gzip
    import io
    import tarfile

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arc, src in sorted(members.items()):
            if isinstance(src, bytes):
                add(tar, arc, src)
            elif src.is_file():
                add(tar, arc, src.read_bytes())
            else:
                for p in sorted(q for q in src.rglob("*") if q.is_file()):
                    add(tar, f"{arc}/{p.relative_to(src).as_posix()}", p.read_bytes())
    with atomic_path(dest) as tmp:
        with gzip.GzipFile(tmp, "wb", mtime=0) as gz:
            gz.write(buf.getvalue())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp directory next to `path`; on success swap it in place of `path`.

    For model folders: a crash leaves the previous complete folder (or none), never a partial one.
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
