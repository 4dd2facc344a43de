"""The tests' loopback servers, one module for the tests, the benchmarks and the scripts: a server subprocess
started once it answers and stopped with its process group (the port and the stop from qrewrite.procs), and handles
on the two scripted TEST FAKES that live beside this file (fake_openai_server.py, an OpenAI-compatible server;
fault_rag_server.py, the real RAG app behind a fault wrapper).

The fakes stay in tests/ so fault injection never ships: the package (pyproject's `qrewrite*`) holds none of it.
Imported as `tests.servers` from the repo root (pytest's `pythonpath`, or `python -m bench.x` / `python -m
scripts.x`, which put the root first on sys.path); tests/conftest.py re-exports the helpers its test files import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from qrewrite.procs import free_port, stop_process

TESTS = Path(__file__).resolve().parent
FAKE_OPENAI_SERVER = TESTS / "fake_openai_server.py"
FAULT_RAG_SERVER = TESTS / "fault_rag_server.py"


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up in {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    """A test server stopped with its process group (qrewrite.procs, the one stop helper), 10 s to go quietly."""
    stop_process(proc, grace_s=10.0)


def start_server(cmd: list[str], health_url: str, cwd: Path, log: Path, env: dict | None = None,
                 timeout: float = 60) -> subprocess.Popen:
    """`cmd` in its own session (stopped as a group), its output in `log`, once `health_url` answers."""
    fh = open(log, "w")
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)
    try:
        wait_http(health_url, timeout, proc)
    except Exception:
        stop(proc)
        raise RuntimeError(f"server {cmd} failed to start:\n{log.read_text()[-2000:]}")
    return proc


class Scripted:
    """Handle on a scripted fake: its behaviour (STATE/script.json) and a log of every request it answered
    (STATE/requests.jsonl); see the fakes' docstrings. `proc` is set when this module started the server."""

    def __init__(self, url: str, state_dir: Path, proc: subprocess.Popen | None = None):
        self.url, self.state_dir, self.proc = url, state_dir, proc

    def script(self, **behaviour) -> None:
        (self.state_dir / "script.json").write_text(json.dumps(behaviour))

    def requests(self) -> list[dict]:
        log = self.state_dir / "requests.jsonl"
        if not log.exists():
            return []
        return [json.loads(l) for l in log.read_text().splitlines() if l.strip()]

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def start_fake_openai(workdir: Path, python: str = sys.executable) -> Scripted:
    """The OpenAI-compatible fake on a free port, its state and log under `workdir`."""
    state = workdir / "fake_openai"
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_server([python, str(FAKE_OPENAI_SERVER), "--port", str(port), "--state", str(state)],
                        f"http://127.0.0.1:{port}/health", workdir, workdir / "fake_openai.log")
    return Scripted(f"http://127.0.0.1:{port}/v1", state, proc)


def start_fault_rag(project: Path, workdir: Path) -> Scripted:
    """The project's RAG app (its config.yaml's KBs) behind the fault wrapper on a free port."""
    state = workdir / "fault_rag"
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_server([sys.executable, str(FAULT_RAG_SERVER), "--config", "config.yaml", "--port", str(port),
                         "--state", str(state)], f"http://127.0.0.1:{port}/healthz", project, workdir / "fault_rag.log")
    return Scripted(f"http://127.0.0.1:{port}", state, proc)
