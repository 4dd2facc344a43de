"""The image a stage runs in (its stats and lineage.json record it) and the digest of an image a rule names
(`qrewrite lineage verify` compares the two).

Digests are "sha256:<hex>":
* an Apptainer image (`snakemake --sdm apptainer`, the Slurm profile): the SIF file's sha256. Inside the
  container Apptainer names the file ($APPTAINER_CONTAINER), which is hashed once per process;
* a podman image (scripts/containers.py run): podman's image id, the sha256 of the image's config, the same
  in podman's store and in the image's OCI archive. A container cannot see its own image, so the runner passes
  it in: $QREWRITE_IMAGE (the reference, `containers-storage:NAME`) and $QREWRITE_IMAGE_DIGEST (another OCI
  runtime can pass the same two).

A stage that finds itself in a container whose image it cannot name fails at once, with what to do: a model
or stats file without the digest of the image that made it would defeat the record.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import sha256_file

IMAGE_ENV = "QREWRITE_IMAGE"
DIGEST_ENV = "QREWRITE_IMAGE_DIGEST"
OCI_PREFIX = "containers-storage:"  # podman's name for an image in its local store (containers-transports(5))
# podman mounts it into every container (/.dockerenv is no such sign: it stays in root filesystems exported
# from docker images, as on the dev machines)
_PODMAN_MARKER = "/run/.containerenv"
_DIGEST = re.compile(r"^(sha256:)?([0-9a-f]{64})$")


def _digest(value: str, source: str) -> str:
    m = _DIGEST.match(value.strip())
    if not m:
        raise QrewriteError(f"{source} is not a sha256 digest: {value!r}")
    return "sha256:" + m.group(2)


@functools.cache
def running_image() -> dict | None:
    """{"runtime", "image", "digest"} of the image this process runs in; None on the host (no container)."""
    sif = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if sif:
        if not Path(sif).is_file():
            raise QrewriteError(f"Apptainer runs this job in {sif}, which cannot be read inside the container, so "
                                "its digest cannot be recorded",
                                hint="keep the images under the repo (containers/*.sif) or bind their folder "
                                     "(QREWRITE_APPTAINER_BIND, docs/cluster.md)")
        return {"runtime": "apptainer", "image": sif, "digest": "sha256:" + sha256_file(sif)}
    podman = Path(_PODMAN_MARKER).exists()
    digest = os.environ.get(DIGEST_ENV)
    if digest:
        return {"runtime": "podman" if podman else "oci", "image": os.environ.get(IMAGE_ENV),
                "digest": _digest(digest, f"${DIGEST_ENV}")}
    if podman:
        raise QrewriteError(f"this runs in a podman container, and ${DIGEST_ENV} does not say which image",
                            hint="start it with `python3 -m scripts.containers run IMAGE -- ...`, or pass "
                                 f"-e {IMAGE_ENV}={OCI_PREFIX}REF -e {DIGEST_ENV}=$(podman image inspect "
                                 "--format '{{.Id}}' REF)")
    return None


def with_image(stats: dict) -> dict:
    """A stage's stats with the image it ran in (`container`: None on the host)."""
    return {**stats, "container": running_image()}


def in_image(path: str) -> bool:
    """Whether `path` is one of the image's own files (its Python environment: /opt/venv, /usr), not the
    mounted project's: such an input, e.g. the base model's GGUF inside a pinned package, is checked through
    the image's digest wherever the image's files cannot be read."""
    if running_image() is None or not os.path.isabs(path):
        return False
    return any(Path(path).resolve().is_relative_to(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix})


def snakemake_image_path(ref: str, root: Path) -> Path:
    """Where `snakemake --sdm apptainer` keeps the SIF it pulled for a docker:// / oras:// / library:// reference
    (snakemake.deployment.singularity.Image: .snakemake/singularity/<md5 of the reference>.simg)."""
    return root / ".snakemake" / "singularity" / f"{hashlib.md5(ref.encode(), usedforsecurity=False).hexdigest()}.simg"


def image_digest(ref: str, root: Path) -> str:
    """Digest of the image `ref` names now (config `containers:`; relative paths under `root`). Raises
    QrewriteError when it cannot be found here."""
    if ref.startswith(OCI_PREFIX):
        name = ref[len(OCI_PREFIX):]
        if shutil.which("podman") is None:
            raise QrewriteError(f"{ref} is a podman image and podman is not installed here")
        proc = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise QrewriteError(f"podman has no image {name}", hint="build it: make containers")
        return _digest(proc.stdout, f"podman's id of {name}")
    path = snakemake_image_path(ref, root) if "://" in ref else root / ref
    if not path.is_file():
        raise QrewriteError(f"image {ref} not found ({path})", hint="build or convert it (docs/cluster.md)")
    return "sha256:" + sha256_file(path)
