"""Run a subcommand in the environment that has its framework.

ms-swift and verl pin different transformers versions, so each lives in its own environment
(`.venvs/swift`, `.venvs/verl` locally; the swift and verl images, containers/*.Containerfile, on the cluster).
A rule always calls plain `qrewrite <command>`: if this Python already has the framework (inside the
container, or the env's own `qrewrite`), the command runs here; otherwise it re-executes itself, once,
under the env's interpreter and says so in the log. Inside an image it never does: the image is the
environment its rule names, and a host venv seen through the mounted checkout is not.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

from . import REPO
from .errors import QrewriteError

log = logging.getLogger(__name__)

FRAMEWORK_MODULE = {"swift": "swift", "verl": "verl"}
_MARK = "QREWRITE_IN_ENV"


def repo_pythonpath(environ=os.environ) -> str:
    """The repo first (trainer subprocesses import qrewrite for the reward), then whatever PYTHONPATH held:
    on the GPU machine that is the pip --target folder the staged wheels went into (tools.gpukit.wheel_stage)."""
    return os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH", "")) if p)


def env_python(name: str) -> Path:
    """The interpreter of env `name`: $QREWRITE_<NAME>_PYTHON, else .venvs/<name>/bin/python in the checkout."""
    override = os.environ.get(f"QREWRITE_{name.upper()}_PYTHON")
    return Path(override) if override else REPO / ".venvs" / name / "bin" / "python"


def has_framework(name: str) -> bool:
    return importlib.util.find_spec(FRAMEWORK_MODULE[name]) is not None


def ensure_env(name: str, argv: list[str]) -> None:
    """Return if this Python can run `name`'s framework; else exec `python -m qrewrite *argv` in that env."""
    if has_framework(name):
        return
    from .lineage.container import running_image

    image = running_image()
    if image is not None:
        raise QrewriteError(f"this command needs the {name} environment, and this runs in the image "
                            f"{image['image'] or image['digest']}, which has no {FRAMEWORK_MODULE[name]!r}",
                            hint=f"run it in the {name} image (config containers.{name}; its rule names it)")
    python = env_python(name)
    if os.environ.get(_MARK) == name:
        raise QrewriteError(f"{python} was chosen as the {name} env but cannot import {FRAMEWORK_MODULE[name]!r}",
                            hint=f"rebuild it: rm -rf .venvs/{name} && make .venvs/{name}/.installed")
    if not python.exists():
        raise QrewriteError(
            f"this command needs the {name} environment: {FRAMEWORK_MODULE[name]!r} is not importable in "
            f"{sys.executable} and {python} does not exist",
            hint=f"build it with `make .venvs/{name}/.installed` (pins in envs/{name}.txt), run inside "
                 f"the {name} image (containers/{name}.Containerfile), or set QREWRITE_{name.upper()}_PYTHON")
    env = dict(os.environ)
    env[_MARK] = name
    env["PYTHONPATH"] = repo_pythonpath(env)
    log.info("running `qrewrite %s` in the %s env (%s)", " ".join(argv[:1]), name, python)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(python), [str(python), "-m", "qrewrite", *argv], env)


def own_bin_first_on_path(environ=os.environ) -> None:
    """Put the bin folder of this Python first on PATH when it holds `qrewrite`: the Snakefile calls this, so its
    rules' plain `qrewrite` is the one next to the Snakemake that runs them (`.venv/bin/snakemake` works with a
    PATH that does not hold .venv/bin). A conda env's activation puts its own bin in front again; Apptainer keeps
    the image's PATH, so in a container the image's `qrewrite` runs."""
    here = Path(sys.executable).parent
    if (here / "qrewrite").is_file():
        environ["PATH"] = os.pathsep.join([str(here), environ.get("PATH", "")])
