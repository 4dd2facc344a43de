"""Carry a pinned wheel set to the lent GPU machine, which has no network, in pieces of at most 60 MiB.

One device `run` call carries at most 64 MiB (the working tree included), and the vLLM 0.24.0 wheel alone
is 279 MB, so the set is cut up here and put back together there:

here   plan        resolve the pins for the device's Python/platform (pip --dry-run --report; pip 23.2 fetches
                   whole wheels to read their metadata, into its cache, so `download` reuses them)
                   (a pin with no wheel at all is built here from its sdist, pure-Python only)
       download    fetch the planned wheels (pip download --no-deps), check every sha256 against the plan
       split       numbered chunk folders chunk-00, chunk-01, ... of at most --max-mib each; files bigger than
                   a chunk are cut into byte pieces; every chunk holds manifest.json (sha256 of every piece
                   and every whole file). Any file can ride along (a GGUF, an adapter, data), not only wheels
there  gather      one call per chunk: check the carried chunk's pieces and copy it out of the repo
       install     all chunks present? every piece and every re-joined file matches its sha256? then
                   pip install --no-index --no-deps --target DIR for the wheels; other files go to --files-to

Standard library only: the device's python3 runs it straight from the repo (`python3 -m tools.gpukit.wheel_stage`).
docs/gpu-check.md ("verl staging") has the exact sequence of device calls.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_dir, atomic_path

MIB = 1024 * 1024
MANIFEST = "manifest.json"
FORMAT = 1
# Room kept free in every chunk for its copy of manifest.json (checked after writing, not assumed).
MANIFEST_RESERVE = 256 * 1024
# The lent GPU image (docs/gpu-check.md): CPython 3.12.3 (Ubuntu 24.04, glibc 2.39) on x86-64. pip matches
# manylinux tags exactly, so every glibc level up to 2.39 is listed (torch 2.11's nvidia-nccl-cu13 2.28.9,
# resolved though never carried, exists only as manylinux_2_18).
PYTHON_VERSION = "3.12"
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)), "manylinux2014_x86_64", "manylinux2010_x86_64",
             "manylinux1_x86_64", "linux_x86_64")
# The image's CUDA torch stack: vLLM 0.24.0 pins torch==2.11.0, which the image already has, together with the
# CUDA wheels that torch requires (nvidia-*, cuda-*, triton: found in torch's own metadata, see torch_stack);
# carrying a second copy would be GBs and could shadow the image's. CUDA wheels that other packages want
# (nvidia-cutlass-dsl for vLLM, say) are not torch's and travel.
TORCH = ("torch", "torchvision", "torchaudio")
CUDA_PARTS = ("nvidia-*", "cuda-*", "triton")


class StageError(QrewriteError):
    """A staging step found something wrong (bad piece, missing chunk, unresolvable pin)."""


def canon(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- plan (here, network)

def read_pins(files: Iterable[str | Path]) -> list[str]:
    """Requirement lines of pip requirement files (comments and blank lines dropped, order kept, no repeats)."""
    out: list[str] = []
    for f in files:
        for line in Path(f).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and line not in out:
                if line.startswith("-"):
                    raise StageError(f"pip option {line!r} is not supported here", file=str(f))
                out.append(line)
    return out


def read_have(path: str | Path | None) -> dict[str, str | None]:
    """What the device image already holds: `name==version` (that version) or `name` (any version)."""
    have: dict[str, str | None] = {}
    if path:
        for line in read_pins([path]):
            name, _, version = line.partition("==")
            have[canon(name)] = version.strip() or None
    return have


def _pin_name(pin: str) -> str:
    return canon(re.split(r"[<>=!~;\[ ]", pin, 1)[0])


def _pip_platform_args(python_version: str, platforms: Sequence[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            "--abi", "cp" + python_version.replace(".", "")]
    for p in platforms:
        args += ["--platform", p]
    return args


def build_wheel(pin: str, build_dir: Path, *, pip: Sequence[str], run: Callable) -> Path:
    """A wheel from the sdist of a pin that has none; only a pure-Python one is sure to fit the device."""
    before = set(build_dir.glob("*.whl"))
    # --no-binary for this name only: its build backend (setuptools) may still come as a wheel
    run([*pip, "wheel", "--no-deps", "--no-binary", _pin_name(pin), "-w", str(build_dir), pin], check=True)
    built = [p for p in set(build_dir.glob("*.whl")) - before if canon(p.name.split("-")[0]) == _pin_name(pin)]
    if len(built) != 1 or not built[0].name.endswith("-none-any.whl"):
        raise StageError(f"{pin}: expected one pure-Python wheel built from its sdist, got {[p.name for p in built]}")
    return built[0]


def resolve(pins: Sequence[str], build_dir: str | Path, *, python_version: str = PYTHON_VERSION,
            platforms: Sequence[str] = PLATFORMS, pip: Sequence[str] = (sys.executable, "-m", "pip"),
            run: Callable = subprocess.run, max_sdist: int = 20) -> dict:
    """pip's install report for `pins` on the device's platform (only metadata is fetched).

    pip resolves a foreign platform only with --only-binary=:all:, so a pin that exists only as an sdist
    (antlr4-python3-runtime, jieba) stops the resolver: it is built here as a pure-Python wheel into
    `build_dir`, which the resolver then reads with --find-links, so packages that depend on it (hydra-core
    on antlr4) resolve against it too.
    """
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    built: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="qrw-plan-") as tmp:
        for _ in range(max_sdist + 1):
            reqs, report = Path(tmp) / "reqs.txt", Path(tmp) / "report.json"
            reqs.write_text("\n".join(pins) + "\n", encoding="utf-8")
            report.unlink(missing_ok=True)
            argv = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                    "--target", str(Path(tmp) / "target"), *_pip_platform_args(python_version, platforms),
                    "--find-links", str(build_dir), "-r", str(reqs)]
            proc = run(argv, capture_output=True, text=True)
            if proc.returncode == 0:
                return json.loads(report.read_text(encoding="utf-8"))
            m = re.search(r"No matching distribution found for (\S+)", proc.stderr or "")
            stuck = [p for p in pins if m and _pin_name(p) == _pin_name(m.group(1)) and _pin_name(p) not in built]
            if not stuck:
                raise StageError("pip could not resolve the pins for the device platform:\n"
                                 + "\n".join((proc.stderr or "").strip().splitlines()[-15:]))
            build_wheel(stuck[0], build_dir, pip=pip, run=run)
            built.add(_pin_name(stuck[0]))
    raise StageError(f"more than {max_sdist} pins have no wheel: {sorted(built)}")


def _requirement(req: str) -> tuple[str, set[str], str | None]:
    """name, extras asked for, and the extra this requirement belongs to (None: always) of a Requires-Dist."""
    m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req)
    extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
    asked = {canon(e) for e in (m.group(2) or "").split(",") if e.strip()}
    return canon(m.group(1)), asked, canon(extra.group(1)) if extra else None


def torch_stack(report: dict) -> set[str]:
    """torch, torchvision, torchaudio and the CUDA wheels the resolved torch pulls in, transitively: torch 2.11
    asks for cuda-toolkit[cublas,cufft,...], whose extras name nvidia-cublas, nvidia-cufft, ... The image holds
    exactly these next to its torch; CUDA wheels outside that closure (nvcc, cutlass-dsl) are not there."""
    requires = {canon(i["metadata"]["name"]): i["metadata"].get("requires_dist") or [] for i in report.get("install", [])}
    names = set(TORCH)
    todo = [(n, set()) for n in TORCH if n in requires]
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        for req in requires.get(name, []):
            dep, asked, extra = _requirement(req)
            if (extra is None or extra in extras) and any(fnmatch.fnmatchcase(dep, p) for p in CUDA_PARTS):
                names.add(dep)
                todo.append((dep, asked))
    return names


def make_plan(report: dict, *, exclude: Sequence[str] = (), have: dict[str, str | None] | None = None,
              build_dir: str | Path | None = None) -> dict:
    """Which resolved wheels travel: all but the image's torch stack, the `exclude` names (globs) and what the
    image has at the resolved version."""
    have = have or {}
    stack = torch_stack(report)
    wheels, skipped = [], []
    for item in report.get("install", []):
        meta, info = item["metadata"], item["download_info"]
        name, version = canon(meta["name"]), meta["version"]
        if name in stack:
            skipped.append({"name": name, "version": version, "why": "the image's torch stack"})
            continue
        if any(fnmatch.fnmatchcase(name, pat) for pat in exclude):
            skipped.append({"name": name, "version": version, "why": "--exclude"})
            continue
        if name in have and have[name] in (None, version):
            skipped.append({"name": name, "version": version, "why": f"image has {have[name] or 'it'}"})
            continue
        url = info["url"]
        # file:// = a wheel on this machine: resolve's build_dir, or a local index/--find-links of pip's config
        local = Path(url.removeprefix("file://")) if url.startswith("file://") else None
        sha = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if local and not sha:
            sha = sha256_file(local)
        built = bool(local and build_dir and local.parent.resolve() == Path(build_dir).resolve())
        wheels.append({"name": name, "version": version, "filename": url.rsplit("/", 1)[-1], "url": url,
                       "sha256": sha, "local": bool(local), "built_here": built, "image_version": have.get(name)})
    return {"format": FORMAT, "wheels": sorted(wheels, key=lambda w: w["name"]),
            "skipped": sorted(skipped, key=lambda s: s["name"])}


def download(plan: dict, dest: str | Path, *, python_version: str = PYTHON_VERSION,
             platforms: Sequence[str] = PLATFORMS, pip: Sequence[str] = (sys.executable, "-m", "pip"),
             run: Callable = subprocess.run) -> list[Path]:
    """Fetch the plan's wheels into `dest` (those already on this machine are copied), check every sha256."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{w['name']}=={w['version']}" for w in plan["wheels"] if not w["local"]]
    if pins:
        run([*pip, "download", "--no-deps", *_pip_platform_args(python_version, platforms), "-d", str(dest),
             *pins], check=True)
    out = []
    for w in plan["wheels"]:
        path = dest / w["filename"]
        if w["local"]:
            shutil.copy2(w["url"].removeprefix("file://"), path)
        if not path.is_file():
            raise StageError(f"{w['filename']} was not downloaded into {dest}")
        if w["sha256"] and sha256_file(path) != w["sha256"]:
            raise StageError(f"{path} does not match the sha256 the plan recorded ({w['sha256']})")
        out.append(path)
    return out


# --------------------------------------------------------------------------- split (here, no network)

def _pack(pieces: list[dict], capacity: int) -> list[list[dict]]:
    """First-fit decreasing: few chunks, each at most `capacity` bytes."""
    chunks: list[list[dict]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-p["size"], p["file"])):
        for i, free in enumerate(room):
            if piece["size"] <= free:
                chunks[i].append(piece)
                room[i] -= piece["size"]
                break
        else:
            chunks.append([piece])
            room.append(capacity - piece["size"])
    return chunks


def split(src: str | Path, stage: str | Path, *, max_mib: float = 60) -> dict:
    """Cut the files of `src` (wheels, and anything else to carry) into numbered chunk folders under `stage`
    (replaced atomically)."""
    src = Path(src)
    wheel_files = sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith("."))
    if not wheel_files:
        raise StageError(f"no files in {src}")
    max_bytes = int(max_mib * MIB)
    capacity = max_bytes - MANIFEST_RESERVE
    if capacity <= 0:
        raise StageError(f"--max-mib {max_mib} leaves no room beside the manifest")
    wheels, pieces = [], []
    for path in wheel_files:
        size = path.stat().st_size
        n = max(1, -(-size // capacity))
        names = [path.name] if n == 1 else [f"{path.name}.part{i:03d}" for i in range(n)]
        entry = {"file": path.name, "size": size, "sha256": sha256_file(path), "pieces": names}
        wheels.append(entry)
        for i, piece in enumerate(names):
            pieces.append({"file": piece, "wheel": path.name, "offset": i * capacity,
                           "size": min(capacity, size - i * capacity)})
    chunks = _pack(pieces, capacity)
    with atomic_dir(stage) as tmp:
        for ci, chunk in enumerate(chunks):
            cdir = tmp / f"chunk-{ci:02d}"
            cdir.mkdir()
            for piece in chunk:
                piece["chunk"] = cdir.name
                piece["sha256"] = _copy_range(src / piece["wheel"], piece["offset"], piece["size"],
                                              cdir / piece["file"])
        manifest = {"format": FORMAT, "max_bytes": max_bytes, "chunks": [f"chunk-{i:02d}" for i in range(len(chunks))],
                    "files": wheels,
                    "pieces": sorted(({k: p[k] for k in ("file", "wheel", "chunk", "size", "sha256")}
                                      for p in pieces), key=lambda p: p["file"])}
        text = json.dumps(manifest, indent=1) + "\n"
        if len(text.encode()) > MANIFEST_RESERVE:
            raise StageError(f"manifest is {len(text)} bytes, more than the {MANIFEST_RESERVE} kept for it")
        for name in [*manifest["chunks"], "."]:
            (tmp / name / MANIFEST).write_text(text, encoding="utf-8")
        for name in manifest["chunks"]:
            total = sum(p.stat().st_size for p in (tmp / name).iterdir())
            if total > max_bytes:  # cannot happen given the reserve; checked because the limit is hard
                raise StageError(f"{name} is {total} bytes, over {max_bytes}")
    return manifest


def _copy_range(src: Path, offset: int, size: int, dest: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        fin.seek(offset)
        left = size
        while left:
            block = fin.read(min(MIB, left))
            if not block:
                raise StageError(f"{src} ended early at byte {offset + size - left}")
            h.update(block)
            fout.write(block)
            left -= len(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- there (no network)

def load_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        found = sorted(Path(folder).glob(f"chunk-*/{MANIFEST}"))
        if not found:
            raise StageError(f"no {MANIFEST} in {folder} or its chunk-*/ folders")
        path = found[0]
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise StageError(f"{path}: manifest format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def verify_chunk(chunk_dir: str | Path, manifest: dict | None = None) -> list[str]:
    """Check every piece the manifest puts in this chunk; returns their names."""
    chunk_dir = Path(chunk_dir)
    manifest = manifest or load_manifest(chunk_dir)
    mine = [p for p in manifest["pieces"] if p["chunk"] == chunk_dir.name]
    if chunk_dir.name not in manifest["chunks"]:
        raise StageError(f"{chunk_dir} is not one of the manifest's chunks {manifest['chunks']}")
    for p in mine:
        _check_piece(chunk_dir / p["file"], p)
    return [p["file"] for p in mine]


def _check_piece(path: Path, piece: dict) -> None:
    where = f"{piece['chunk']}/{piece['file']}"
    if not path.is_file():
        raise StageError(f"piece {where} is missing", hint=f"carry {piece['chunk']} again")
    got = sha256_file(path)
    if path.stat().st_size != piece["size"] or got != piece["sha256"]:
        raise StageError(f"piece {where} is corrupt: sha256 {got}, expected {piece['sha256']} "
                         f"({path.stat().st_size} bytes, expected {piece['size']})",
                         hint=f"carry {piece['chunk']} again")


def gather(chunk_dir: str | Path, dest: str | Path) -> Path:
    """Device side, one call per chunk: verify the carried chunk, then copy it to dest/<chunk name>."""
    chunk_dir = Path(chunk_dir)
    verify_chunk(chunk_dir)
    target = Path(dest) / chunk_dir.name
    with atomic_dir(target) as tmp:
        for f in chunk_dir.iterdir():
            shutil.copy2(f, tmp / f.name)
    return target


def reassemble(stage: str | Path, out_dir: str | Path) -> list[Path]:
    """Check that every chunk is there and every piece intact, re-join the wheels, check them whole."""
    stage, out_dir = Path(stage), Path(out_dir)
    manifest = load_manifest(stage)
    missing = [c for c in manifest["chunks"] if not (stage / c).is_dir()]
    if missing:
        raise StageError(f"missing chunk folder(s) under {stage}: {', '.join(missing)} "
                         f"(expected {len(manifest['chunks'])}: {manifest['chunks'][0]}..{manifest['chunks'][-1]})",
                         hint="gather each missing chunk with its own device call")
    pieces = {p["file"]: p for p in manifest["pieces"]}
    for p in manifest["pieces"]:
        _check_piece(stage / p["chunk"] / p["file"], p)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for w in manifest["files"]:
        dest = out_dir / w["file"]
        with atomic_path(dest) as tmp:
            with open(tmp, "wb") as fout:
                for name in w["pieces"]:
                    with open(stage / pieces[name]["chunk"] / name, "rb") as fin:
                        shutil.copyfileobj(fin, fout, MIB)
            got = sha256_file(tmp)
            if got != w["sha256"]:
                raise StageError(f"re-joined file {w['file']} has sha256 {got}, expected {w['sha256']}")
        out.append(dest)
    return out


def install(stage: str | Path, target: str | Path, *, files_to: str | Path | None = None,
            pip: Sequence[str] = (sys.executable, "-m", "pip"), run: Callable = subprocess.run) -> list[Path]:
    """reassemble, pip install --no-index --no-deps --target the wheels (nothing fetched, nothing resolved),
    move the other files to `files_to`."""
    manifest = load_manifest(stage)
    others = [f["file"] for f in manifest["files"] if not f["file"].endswith(".whl")]
    if others and not files_to:
        raise StageError(f"the stage holds files that are no wheels ({', '.join(others)}): pass --files-to DIR")
    with tempfile.TemporaryDirectory(prefix="qrw-wheels-") as tmp:
        files = reassemble(stage, tmp)
        wheels = [f for f in files if f.name.endswith(".whl")]
        if wheels:
            run([*pip, "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                 "--target", str(target), *map(str, wheels)], check=True)
        out = [Path(target) / w.name for w in wheels]
        for f in files:
            if not f.name.endswith(".whl"):
                Path(files_to).mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), Path(files_to) / f.name)
                out.append(Path(files_to) / f.name)
        return out


# --------------------------------------------------------------------------- CLI

def _human(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.gpukit.wheel_stage",
        description="Stage a pinned wheel set for the GPU machine in <= 60 MiB chunks (docs/gpu-check.md, "
                    "'verl staging'). Here: plan, download, split. There: gather (one call per chunk), install.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="resolve pins for the device (cp312, manylinux x86-64); writes plan.json; "
                       "needs the network")
    p.add_argument("-r", "--requirement", action="append", required=True, help="pip requirement file (repeatable)")
    p.add_argument("--have", help="name==version lines the device image already holds (skipped at that version)")
    p.add_argument("--exclude", action="append", default=[],
                   help="name or glob never carried (torch, torchvision, torchaudio and the CUDA wheels torch "
                        "requires never are)")
    p.add_argument("--unpin", action="append", default=[],
                   help="drop this name's pin from the requirement files and let the resolver choose (a CPU pin "
                        "that the GPU set cannot meet: numpy, whose 2.4.6 vLLM's mistral-common excludes)")
    p.add_argument("--out", required=True, help="plan.json to write; pip's report goes next to it (.report.json)")
    p.add_argument("--from-report", help="plan from a saved .report.json instead of resolving again (another "
                   "--exclude or --have in seconds)")
    p = sub.add_parser("download", help="fetch the plan's wheels (pip download --no-deps), check their sha256")
    p.add_argument("plan")
    p.add_argument("dest", help="wheel folder (git-ignored, e.g. .whl/verl-wheels)")
    p = sub.add_parser("split", help="cut a folder of wheels (and other files to carry) into numbered chunk "
                       "folders with manifest.json")
    p.add_argument("src")
    p.add_argument("stage", help="chunk folders go here (replaced), e.g. .whl/verl")
    p.add_argument("--max-mib", type=float, default=60, help="bytes per chunk folder, manifest included (60)")
    p = sub.add_parser("gather", help="device: verify one carried chunk and copy it to DEST/<chunk>")
    p.add_argument("chunk")
    p.add_argument("dest")
    p = sub.add_parser("verify", help="verify every chunk present under STAGE (no install)")
    p.add_argument("stage")
    p = sub.add_parser("install", help="device: all chunks present and intact? then pip install --no-index "
                       "--no-deps --target TARGET")
    p.add_argument("stage")
    p.add_argument("--target", required=True, help="pip --target folder for the wheels (put it on PYTHONPATH)")
    p.add_argument("--files-to", help="folder for the files that are no wheels (GGUF, adapter, data)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "plan":
            built = Path(args.out).with_suffix(".built")  # sdist-only pins, built as wheels
            unpin = {canon(n) for n in args.unpin}
            if args.from_report:
                report = json.loads(Path(args.from_report).read_text(encoding="utf-8"))
            else:
                report = resolve([p for p in read_pins(args.requirement) if _pin_name(p) not in unpin], built)
                with atomic_path(Path(args.out).with_suffix(".report.json")) as tmp:
                    tmp.write_text(json.dumps(report) + "\n", encoding="utf-8")
            plan = make_plan(report, exclude=args.exclude, have=read_have(args.have),
                             build_dir=built)
            with atomic_path(args.out) as tmp:
                tmp.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
            for w in plan["wheels"]:
                note = f"  (image has {w['image_version']})" if w["image_version"] else ""
                note += "  (sdist only: built here)" if w["built_here"] else ""
                print(f"carry  {w['name']}=={w['version']}{note}")
            for s in plan["skipped"]:
                print(f"skip   {s['name']}=={s['version']}  ({s['why']})")
            print(f"{len(plan['wheels'])} wheels to carry, {len(plan['skipped'])} left home; pip's report has no "
                  f"sizes: `download` then `split` prints them")
        elif args.cmd == "download":
            plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
            files = download(plan, args.dest)
            print(f"{len(files)} wheels, {_human(sum(f.stat().st_size for f in files))} in {args.dest}")
        elif args.cmd == "split":
            m = split(args.src, args.stage, max_mib=args.max_mib)
            for c in m["chunks"]:
                size = sum(f.stat().st_size for f in (Path(args.stage) / c).iterdir())
                print(f"{c}  {_human(size)}  {len([p for p in m['pieces'] if p['chunk'] == c])} pieces")
            print(f"{len(m['files'])} files, {_human(sum(w['size'] for w in m['files']))}, "
                  f"{len(m['chunks'])} chunks")
        elif args.cmd == "gather":
            print(f"ok {gather(args.chunk, args.dest)}")
        elif args.cmd == "verify":
            with tempfile.TemporaryDirectory() as tmp:
                print(f"ok: {len(reassemble(args.stage, tmp))} files intact")
        elif args.cmd == "install":
            done = install(args.stage, args.target, files_to=args.files_to)
            print(f"installed {len(done)} files: wheels into {args.target}, others into {args.files_to}")
    except (QrewriteError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
