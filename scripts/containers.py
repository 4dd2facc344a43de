"""Build the project's images with podman, save them for Apptainer, run commands in them.

    python3 -m scripts.containers build [IMAGE ...] [--torch cpu|cuda] [--wheels DIR]   # make containers: cpu swift
    python3 -m scripts.containers build verl --resolve-only                           # verl's pins resolve?
    python3 -m scripts.containers save IMAGE ... [--out-dir containers]                  # OCI archive per image
    python3 -m scripts.containers run IMAGE [--network host] -- COMMAND ...              # in the image, repo mounted
    python3 -m scripts.containers ref IMAGE [--torch cpu|cuda]                            # its reference and digest

One recipe per image: containers/<image>.Containerfile (cpu, swift, verl), each FROM containers/base.Containerfile,
which is FROM a Debian bookworm root filesystem made here with debootstrap (no image registry is needed). The
pins are envs/*.txt. On a cluster, Apptainer converts the saved OCI archive: `apptainer build
containers/swift.sif oci-archive://containers/swift.oci.tar` (docs/cluster.md).

torch: the swift image takes the CUDA build from PyPI (--torch cuda, the cluster's image) or the CPU build
(--torch cpu, the default here) only from a local wheel folder mounted into the build (--wheels, else
$TORCH_WHEELS, else pip's own find-links setting), never from PyPI: a CPU image cannot pull the CUDA build.

Needs podman, runc and debootstrap (Debian: `apt-get install podman runc debootstrap`; root for debootstrap
and rootful podman). Podman reads containers/containers.conf (runc, no default ulimits) unless
CONTAINERS_CONF is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from qrewrite.lineage.container import DIGEST_ENV, IMAGE_ENV, OCI_PREFIX

IMAGES = ("cpu", "swift", "verl")
ROOTFS = "localhost/qrewrite-rootfs:bookworm"
BASE = "localhost/qrewrite-base:latest"
SUITE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
TORCH_IMAGES = {"swift"}  # images whose torch build is chosen (--torch); verl is CUDA only
CA_IN_BUILD = "/etc/ssl/certs/build-ca.crt"


class BuildError(RuntimeError):
    pass


def podman_env() -> dict:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(REPO / "containers/containers.conf"))}


def podman(*args: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("podman") is None:
        raise BuildError("podman is not installed: apt-get install podman runc debootstrap (see scripts/containers.py)")
    return subprocess.run(["podman", *args], env=podman_env(), text=True, check=check,
                          capture_output=capture)


def exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def image_id(ref: str) -> str:
    """podman's image id: the sha256 of the image's config, the same in its OCI archive."""
    return "sha256:" + podman("image", "inspect", "--format", "{{.Id}}", ref, capture=True).stdout.strip()


def size_mb(ref: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref, capture=True).stdout.strip()) / 1e6


def ref(name: str, torch: str = "cpu", resolved: bool = False) -> str:
    """localhost/qrewrite-<name>:<tag>: the swift image's tag is its torch build, verl's is always cuda (or
    `resolved`: the --resolve-only build, which holds no packages)."""
    tag = torch if name in TORCH_IMAGES else ("cuda" if name == "verl" else "latest")
    tag = "resolved" if resolved else tag
    return f"localhost/qrewrite-{name}:{tag}"


def build_rootfs() -> None:
    """Debian bookworm (minbase, python3 + venv) as an image: the base every recipe builds on."""
    if exists(ROOTFS):
        return
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed: apt-get install debootstrap")
    with tempfile.TemporaryDirectory(prefix="qrewrite-rootfs-") as tmp:
        root, tar = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        print(f"debootstrap {SUITE} from {MIRROR} ...", flush=True)
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", SUITE,
                        str(root), MIRROR], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
        podman("import", "--change", "CMD=/bin/bash", str(tar), ROOTFS, capture=True)


def host_ca() -> str | None:
    """The CA bundle pip uses here (PIP_CERT, else Debian's bundle): pip in the build trusts the same CAs."""
    for path in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if path and Path(path).is_file():
            return path
    return None


def torch_version() -> str:
    text = (REPO / "envs/torch.txt").read_text(encoding="utf-8")
    m = re.search(r"^torch==([\w.]+)\s*$", text, re.M)
    if not m:
        raise BuildError("envs/torch.txt has no torch==VERSION line")
    return m.group(1)


def cpu_wheel_dir(given: str | None) -> Path:
    """The folder holding the CPU torch wheel of envs/torch.txt's version: --wheels, $TORCH_WHEELS, or the
    folder(s) pip itself finds links in ($PIP_FIND_LINKS, `pip config get global.find-links`)."""
    candidates = [given] if given else [os.environ.get("TORCH_WHEELS")]
    if not given and not candidates[0]:
        candidates = (os.environ.get("PIP_FIND_LINKS") or "").split()
        conf = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                              capture_output=True, text=True)
        candidates += conf.stdout.split() if conf.returncode == 0 else []
    version = torch_version()
    for c in filter(None, candidates):
        folder = Path(c.removeprefix("file://"))
        if list(folder.glob(f"torch-{version}+cpu-*.whl")):
            return folder
    raise BuildError(f"no CPU torch wheel (torch-{version}+cpu-*.whl) in {[c for c in candidates if c] or 'any folder'}: "
                     "pass --wheels DIR (make containers TORCH_WHEELS=DIR) with that wheel, or build the CUDA "
                     "image (--torch cuda)")


def context_dir(tmp: Path) -> Path:
    """The build context: only what the recipes COPY (envs/, containers/), not the checkout's venvs and data."""
    for sub in ("envs", "containers"):
        shutil.copytree(REPO / sub, tmp / sub, ignore=shutil.ignore_patterns("*.oci.tar", "*.sif"))
    return tmp


def build_one(name: str, target: str, ctx: Path, args: list[str]) -> float:
    start = time.monotonic()
    ca = host_ca()
    ca_args = ["-v", f"{ca}:{CA_IN_BUILD}:ro", "--build-arg", f"PIP_CERT={CA_IN_BUILD}"] if ca else []
    podman("build", "--network", "host", "--layers", "-f", str(ctx / "containers" / f"{name}.Containerfile"),
           "-t", target, *ca_args, *args, str(ctx))
    return time.monotonic() - start


def cmd_build(a) -> None:
    names = a.images or ["cpu", "swift"]
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        raise BuildError(f"unknown image(s) {unknown}: the recipes are {', '.join(IMAGES)}")
    if "verl" in names and a.torch == "cpu" and a.images:
        print("note: the verl image is CUDA only (vLLM): built with torch from PyPI", flush=True)
    if a.resolve_only and names != ["verl"]:
        raise BuildError("--resolve-only is for the verl image (CUDA only): the others build here in full")
    wheels = cpu_wheel_dir(a.wheels) if a.torch == "cpu" and TORCH_IMAGES & set(names) else None
    times = {}
    start = time.monotonic()
    build_rootfs()
    times["rootfs"] = time.monotonic() - start
    with tempfile.TemporaryDirectory(prefix="qrewrite-build-") as tmp:
        ctx = context_dir(Path(tmp))
        times["base"] = build_one("base", BASE, ctx, ["--build-arg", f"ROOTFS={ROOTFS}"])
        for name in names:
            extra = ["--build-arg", f"BASE={BASE}"]
            if name in TORCH_IMAGES:
                extra += ["--build-arg", f"TORCH={a.torch}"] + (["-v", f"{wheels}:/wheels:ro"] if wheels else [])
            if a.resolve_only:
                extra += ["--build-arg", "RESOLVE_ONLY=1"]
            times[name] = build_one(name, ref(name, a.torch, a.resolve_only), ctx, extra)
    if a.resolve_only:
        report = podman("run", "--rm", "--network", "none", ref("verl", resolved=True), "cat",
                        "/opt/qrewrite/resolved.json", capture=True).stdout
        got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report)["install"]}
        print(f"verl image: pip resolves {len(got)} packages for the image's Python, e.g. "
              + ", ".join(f"{k} {got[k]}" for k in ("torch", "vllm", "verl", "transformers", "numpy") if k in got)
              + f"; {times['verl']:.0f} s")
        return
    for name in names:
        target = ref(name, a.torch)
        print(f"{target}: {image_id(target)[:19]}…, {size_mb(target):.0f} MB, built in {times[name]:.0f} s")
    print(f"rootfs {times['rootfs']:.0f} s, base {times['base']:.0f} s; total {time.monotonic() - start:.0f} s")


def cmd_save(a) -> None:
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.images:
        target = ref(name, a.torch)
        archive = out / f"{name}.oci.tar"
        tmp = archive.with_name(f".{archive.name}.tmp")
        tmp.unlink(missing_ok=True)
        podman("save", "--format", "oci-archive", "-o", str(tmp), target)
        os.replace(tmp, archive)
        print(f"{archive}: {target} ({image_id(target)}); on the cluster: "
              f"apptainer build {out / name}.sif oci-archive://{archive}")


def mounts(cwd: Path) -> list[str]:
    """The working directory read-write at its own path (as Apptainer binds it); the checkout whose code runs
    (and, for a git worktree, its git folder), read-only, when the working directory is elsewhere."""
    paths = {cwd: "rw"}
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                         capture_output=True, text=True)
    for extra in (REPO, Path(git.stdout.strip()) if git.returncode == 0 else None):
        if extra is not None and not any(extra.is_relative_to(p) for p in paths):
            paths[extra] = "ro"
    return [x for p, mode in paths.items() for x in ("-v", f"{p}:{p}:{mode}")]


def cmd_run(a) -> int:
    """`podman run` in the image with the working directory and the checkout mounted, run by image id, and that
    id passed in: the stage records it (qrewrite.lineage.container)."""
    target = ref(a.image, a.torch)
    digest = image_id(target)
    cwd = Path.cwd().resolve()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    env = [f"{IMAGE_ENV}={OCI_PREFIX}{target}", f"{DIGEST_ENV}={digest}", f"QREWRITE_REPO={REPO}",
           f"PYTHONPATH={REPO}", *a.env]
    proc = podman("run", "--rm", "--network", a.network, *mounts(cwd), "-w", str(cwd),
                  *[x for e in env for x in ("-e", e)], digest.removeprefix("sha256:"), *cmd, check=False)
    return proc.returncode


def built_refs() -> list[str]:
    """Every name this script builds an image under: each recipe at each torch build and resolved, the base and
    the root filesystem (the base last but one, the root filesystem last: the images build on them)."""
    refs = [ref(n, t, r) for n in IMAGES for t in ("cpu", "cuda") for r in (False, True)]
    return [*dict.fromkeys(refs), BASE, ROOTFS]


def cmd_remove(a) -> None:
    """Remove the images this script built (podman drops their layers with them); other images are left alone.
    CI runs it after the tests: the images (about 4 GB) are not needed by the GPU kit's rehearsal that follows."""
    present = [r for r in built_refs() if exists(r)]
    for r in present:
        print(f"{'would remove' if a.dry_run else 'removing'} {r}")
        if not a.dry_run:
            podman("rmi", r)
    if not present:
        print("no image of this project's to remove")


def cmd_ref(a) -> None:
    target = ref(a.image, a.torch)
    print(f"{OCI_PREFIX}{target} {image_id(target)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/containers.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    torch = dict(choices=("cpu", "cuda"), default="cpu",
                 help="the swift image's torch build: cpu (local wheel, this machine) or cuda (PyPI, the cluster)")
    b = sub.add_parser("build", help="build images (default: cpu swift); layers are cached by podman")
    b.add_argument("images", nargs="*", help=f"of {', '.join(IMAGES)}")
    b.add_argument("--torch", **torch)
    b.add_argument("--wheels", help="folder holding the CPU torch wheel (default: $TORCH_WHEELS, pip's find-links)")
    b.add_argument("--resolve-only", action="store_true",
                   help="verl: build up to pip's resolution of its pins for the image's Python (no install)")
    s = sub.add_parser("save", help="write <out-dir>/<image>.oci.tar (what `apptainer build` converts)")
    s.add_argument("images", nargs="+")
    s.add_argument("--torch", **torch)
    s.add_argument("--out-dir", default="containers")
    r = sub.add_parser("run", help="run a command in an image, the working directory mounted, no network")
    r.add_argument("image", choices=IMAGES)
    r.add_argument("--torch", **torch)
    r.add_argument("--network", default="none", help="podman's --network (default none; host for API calls)")
    r.add_argument("-e", "--env", action="append", default=[], help="NAME=VALUE passed into the container")
    r.add_argument("command", nargs=argparse.REMAINDER)
    f = sub.add_parser("ref", help="print the image's reference (as config `containers:` names it) and digest")
    f.add_argument("image", choices=IMAGES)
    f.add_argument("--torch", **torch)
    m = sub.add_parser("remove", help="remove the images this script built (their names only: other images stay)")
    m.add_argument("--dry-run", action="store_true", help="print what would be removed")
    a = p.parse_args(argv)
    try:
        handlers = {"build": cmd_build, "save": cmd_save, "run": cmd_run, "ref": cmd_ref, "remove": cmd_remove}
        return handlers[a.cmd](a) or 0
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"scripts/containers.py {a.cmd}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
