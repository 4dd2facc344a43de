"""An OpenAI-compatible server for a merged HF model folder: pick the backend, build its command line,
start it, wait until it serves the model, and always stop it (its whole process group).

Backends: `vllm` (`vllm serve`, GPU) and `swift` (ms-swift 4.6 `swift deploy`, transformers engine, CPU or
GPU). The check runs the server module directly (`python -m swift.cli.deploy` is what `swift deploy`
spawns) so that the child is the server itself: the parent-death signal then reaches it when this
process is killed with -9, and a SIGTERM to this process runs the cleanup.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from ..errors import QrewriteError
from ..procs import stop_process as stop
from ..hardware import resolve_dtype

log = logging.getLogger(__name__)

BACKENDS = ("vllm", "swift")
_MODULE = {"vllm": "vllm", "swift": "swift"}


def choose_backend(requested: str) -> tuple[str, str]:
    """(backend, why) of the gateway in the deploy check: `inprocess` (the model in the gateway), or a model server
    behind it (`vllm`, `swift`). `auto` takes vllm where it is importable (a GPU node), else inprocess; a named
    server must be importable."""
    if requested == "inprocess":
        return "inprocess", "deploy.backend: inprocess"
    have = {b: importlib.util.find_spec(_MODULE[b]) is not None for b in BACKENDS}
    if requested == "auto":
        if have["vllm"]:
            return "vllm", f"auto: vllm is importable in {sys.executable}"
        return "inprocess", f"auto: vllm is not importable in {sys.executable}: the model in the gateway"
    if not have[requested]:
        raise QrewriteError(f"deploy.backend is {requested} but {_MODULE[requested]!r} is not importable in "
                            f"{sys.executable}", hint="install it in this env, or set deploy.backend: auto")
    return requested, f"deploy.backend: {requested}"


def server_argv(backend: str, model: str, *, host: str, port: int, name: str, device: str,
                model_type: str, template: str, max_batch_size: int, max_model_len: int | None = None,
                gpu_memory_utilization: float | None = None, launcher: list[str] | None = None,
                dtype: str | None = None) -> list[str]:
    """The server's command line. `launcher` replaces the executable (`vllm` / `swift deploy`), e.g. with
    [python, "-m", "swift.cli.deploy"]. Greedy decoding and max_tokens come with each request. dtype:
    eval.generation.dtype, resolved as the in-process eval resolves it (`resolve_dtype`)."""
    dtype = resolve_dtype(dtype, device)
    if backend == "vllm":
        argv = [*(launcher or ["vllm", "serve"]), model, "--host", host, "--port", str(port),
                "--served-model-name", name, "--dtype", dtype]
        if max_model_len:
            argv += ["--max-model-len", str(max_model_len)]
        if gpu_memory_utilization:
            argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        return argv
    if backend == "swift":
        return [*(launcher or ["swift", "deploy"]), "--model", model, "--model_type", model_type,
                "--template", template, "--infer_backend", "transformers", "--torch_dtype", dtype,
                "--host", host, "--port", str(port), "--served_model_name", name,
                "--max_batch_size", str(max_batch_size), "--verbose", "false"]
    raise QrewriteError(f"unknown deploy backend {backend!r} ({' | '.join(BACKENDS)})")


def launcher(backend: str) -> list[str]:
    """The backend's server from this env; for swift its module itself (what `swift deploy` spawns), so the
    child is the server and no wrapper CLI sits in between."""
    if backend == "vllm":  # vLLM's engine runs in child processes anyway: `vllm serve` of this env
        exe = Path(sys.executable).parent / "vllm"
        return [str(exe) if exe.exists() else "vllm", "serve"]
    return [sys.executable, "-m", "swift.cli.deploy"]


def _die_with_parent() -> None:
    """preexec_fn: the server gets SIGTERM when this process dies, even by SIGKILL (Linux prctl)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return "(no server log)"


def wait_ready(base_url: str, name: str, proc: subprocess.Popen, log_path: Path, timeout: float,
               headers: dict | None = None) -> float:
    """Seconds until GET /v1/models lists `name`; an error with the log's tail if the server exits or times out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise QrewriteError(f"the model server exited with code {proc.returncode} before it was ready "
                                f"(log {log_path}):\n{_tail(log_path)}",
                                hint="the log's last lines say why (model folder, port in use, missing package)")
        try:
            r = httpx.get(f"{base_url}/models", timeout=5, headers=headers)
            if r.status_code == 200 and any(m.get("id") == name for m in r.json().get("data", [])):
                return time.monotonic() - start
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise QrewriteError(f"the model server did not list {name!r} on {base_url}/models within {timeout:.0f}s "
                        f"(log {log_path}):\n{_tail(log_path)}",
                        hint="raise deploy.startup_timeout_s on a slow machine, or read the log")


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Snakemake and Slurm stop a job with SIGTERM: turn it into SystemExit so the server is stopped too."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def serving(argv: list[str], *, base_url: str, name: str, log_path: str | Path, timeout: float,
            env: dict | None = None, headers: dict | None = None) -> Iterator[dict]:
    """Run `argv` until the block ends (also on error, Ctrl-C or SIGTERM); yields {startup_s, pid}."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting the server: %s", shlex.join(argv))
    with _sigterm_raises(), open(log_path, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True,
                                preexec_fn=_die_with_parent)
        try:
            startup = wait_ready(base_url, name, proc, log_path, timeout, headers)
            log.info("server ready on %s after %.1fs (pid %d)", base_url, startup, proc.pid)
            yield {"startup_s": round(startup, 3), "pid": proc.pid}
        finally:
            stop(proc)
            log.info("server stopped (pid %d, exit code %s)", proc.pid, proc.returncode)
