"""Run an ms-swift command (``commands`` builds it): stream its output, fail loudly, stop it at a wall-clock
cap; then find what the run left (checkpoints, swift's logging.jsonl, TensorBoard events).

* transformers >= 5.15 dropped ``TrainingArguments.logging_dir``; swift exports it as
  ``TENSORBOARD_LOGGING_DIR`` with ``os.environ.setdefault`` - so a stale
  ``TENSORBOARD_LOGGING_DIR`` in the environment would win. ``run_swift`` removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from qrewrite.errors import QrewriteError

# --------------------------------------------------------------------------- runner

def swift_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a swift run: offline hubs, no stale TensorBoard dir."""
    env = dict(os.environ)
    env.pop("TENSORBOARD_LOGGING_DIR", None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("MODELSCOPE_OFFLINE", "1")  # no-op for swift, harmless
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("JAX_PLATFORMS", "cpu")  # see qrewrite/rag/local.py: keep jax (via bm25s) off the GPU
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def run_swift(argv: Sequence[str], *, log_file: str | os.PathLike | None = None,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
              tail_lines: int = 30, max_wall_s: float | None = None):
    """Run a swift command, stream its output to the console (and ``log_file``).

    Returns the wall time in seconds; with ``max_wall_s``, ``(wall time, capped)``: the command (its whole
    process group: ``swift sft`` starts the trainer as a child) is stopped once it has run that long, and
    ``capped`` says so. Raises ``QrewriteError`` with the command, exit code and the last output lines when it
    fails (a capped run is not a failure).
    """
    argv = [str(a) for a in argv]
    if not (os.path.isabs(argv[0]) and os.path.exists(argv[0])) and shutil.which(argv[0]) is None:
        raise QrewriteError(f"swift executable {argv[0]!r} not found",
                            hint="build the env: make .venvs/swift (pip install -r envs/swift.txt)")
    print("+ " + " ".join(_quote(a) for a in argv), flush=True)
    tail: list[str] = []
    log = open(log_file, "a", encoding="utf-8") if log_file else None
    start = time.monotonic()
    capped = threading.Event()
    timer = None
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=swift_env(env), cwd=cwd, text=True, errors="replace", bufsize=1,
                                start_new_session=max_wall_s is not None)
        if max_wall_s is not None:
            def stop():
                capped.set()
                msg = f"[qrewrite] wall-clock cap of {max_wall_s / 60:g} min reached: stopping {argv[1]}\n"
                sys.stdout.write(msg)
                if log:
                    log.write(msg)
                _stop_group(proc)
            timer = threading.Timer(max_wall_s, stop)
            timer.daemon = True
            timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if log:
                log.write(line)
            tail.append(line.rstrip("\n"))
            if len(tail) > tail_lines:
                del tail[0]
        rc = proc.wait()
    except KeyboardInterrupt:
        _stop_group(proc) if max_wall_s is not None else proc.terminate()
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if log:
            log.close()
    wall = time.monotonic() - start
    if rc != 0 and not capped.is_set():
        raise QrewriteError(
            f"`{' '.join([os.path.basename(argv[0]), *argv[1:2]])}` failed with exit code {rc} after {wall:.0f}s\n"
            f"  command: {' '.join(_quote(a) for a in argv)}\n  last output:\n    "
            + "\n    ".join(tail[-tail_lines:]),
            file=str(log_file) if log_file else None)
    return (wall, capped.is_set()) if max_wall_s is not None else wall


def _stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the process group started for ``proc``, SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)


# --------------------------------------------------------------------------- outputs

def _checkpoints(output_dir: Path) -> list[Path]:
    cks = [p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(cks, key=lambda p: int(p.name.split("-")[-1]))


def best_checkpoint(output_dir: str | os.PathLike) -> Path:
    """The best checkpoint of a finished ``swift sft`` run in ``output_dir``.

    Order of evidence: ``logging.jsonl`` final record (``best_model_checkpoint``), the
    ``best`` symlink (``--create_checkpoint_symlink true``), the last checkpoint's
    ``trainer_state.json`` ``best_model_checkpoint``, else the last checkpoint.
    """
    out = Path(output_dir)
    best = None
    for rec in read_log_history(out):
        if isinstance(rec, dict) and rec.get("best_model_checkpoint"):
            best = rec["best_model_checkpoint"]
    if best and Path(best).is_dir():
        return Path(best).resolve()  # swift logs the `best` symlink path
    if (out / "best").is_dir():
        return (out / "best").resolve()
    cks = _checkpoints(out)
    for ck in reversed(cks):
        state = ck / "trainer_state.json"
        if state.is_file():
            best = json.loads(state.read_text(encoding="utf-8")).get("best_model_checkpoint")
            if best:
                cand = Path(best) if Path(best).is_absolute() else out / Path(best).name
                if cand.is_dir():
                    return cand
    if cks:
        return cks[-1]
    raise QrewriteError(f"no checkpoint found in {out}", hint="did the swift run finish?")


def has_checkpoint(output_dir: str | os.PathLike) -> bool:
    return bool(_checkpoints(Path(output_dir)))


def last_checkpoint(output_dir: str | os.PathLike) -> Path:
    out = Path(output_dir)
    if (out / "last").is_dir():
        return (out / "last").resolve()
    cks = _checkpoints(out)
    if not cks:
        raise QrewriteError(f"no checkpoint found in {out}", hint="did the swift run finish?")
    return cks[-1]


def read_log_history(output_dir: str | os.PathLike) -> list[dict]:
    """Records of ``output_dir/logging.jsonl`` (swift's per-logging-step json lines)."""
    log = Path(output_dir) / "logging.jsonl"
    if not log.is_file():
        return []
    rows = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the line swift is still writing
    return rows


def event_files(logging_dir: str | os.PathLike) -> list[Path]:
    return sorted(Path(logging_dir).rglob("events.out.tfevents.*"))
