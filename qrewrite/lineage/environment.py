"""What a model was made with and where: code version (git), environment fingerprint, run times and host."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess

from .. import REPO, __version__
from ..io_utils import sha256_file, sha256_json
from .container import running_image


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def code_version() -> dict:
    """Git commit of the code checkout and whether tracked files differ from it (untracked files ignored)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "dirty": None, "note": f"{REPO} is not a git checkout (or git is missing)"}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "dirty": bool(status), "qrewrite_version": __version__}


def _hashes(rels: list[str]) -> dict:
    return {rel: (sha256_file(REPO / rel) if (REPO / rel).is_file() else None) for rel in rels}


def env_fingerprint(env: str) -> dict:
    """Hashes of the pinned requirements (envs/torch.txt + envs/<env>.txt) and of the image's recipe
    (containers/base.Containerfile + containers/<env>.Containerfile), and the image this runs in (its digest;
    None on the host)."""
    reqs = _hashes([f"envs/{name}" for name in ("torch.txt", f"{env}.txt")])
    recipe = _hashes(["containers/base.Containerfile", f"containers/{env}.Containerfile"])
    return {
        "name": env,
        "requirements": reqs,
        "requirements_sha256": sha256_json(reqs) if all(reqs.values()) else None,
        "container_recipe": recipe,
        "container_recipe_sha256": sha256_json(recipe) if all(recipe.values()) else None,
        "container": running_image(),
    }


def run_info(started: float, ended: float) -> dict:
    iso = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    return {"started": iso(started), "ended": iso(ended), "duration_s": round(ended - started, 3),
            "host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_cluster": os.environ.get("SLURM_CLUSTER_NAME")}
