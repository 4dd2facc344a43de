"""Shared helpers for the benchmarks: machine facts, medians, result files, loopback servers.

The servers are the TEST FAKES from tests/ (an OpenAI-compatible server with a fixed injected latency,
and the real RAG app behind a wrapper that adds latency): benchmarks measure how close the pipeline
gets to the bound the services it calls allow, so the services' own speed is pinned.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
RESULTS = REPO / "bench" / "results"
BIN = Path(sys.executable).parent


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from qrewrite.hardware import cpu_has_bf16

    return {"cpu_count": os.cpu_count(), "cpu_model": model, "bf16_units": cpu_has_bf16(), **commit(),
            "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "note": "numbers taken on a machine shared with other jobs: compare ratios measured in the same run"}


def commit() -> dict:
    """The checkout's commit and whether its tracked files differ from it (what a figure was measured on)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short=12", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4)


def against_bound(concurrency: int, walls: list[float], bound: float) -> dict:
    """Median wall time of `walls` as a ratio to `bound` (1.0 = the service's latency is the only cost)."""
    return {"concurrency": concurrency, "wall_s": median(walls), "walls_s": [round(w, 3) for w in walls],
            "bound_s": round(bound, 3), "ratio_to_bound": round(bound / median(walls), 3)}


def concurrency_sweep(run: Callable[[int, int], float], *, n: int, seq_n: int, concurrencies: list[int],
                      repeats: int, latency: float, calls_per_row: int, rate_key: str) -> tuple[list[float], float,
                                                                                               list[dict]]:
    """Benches 1 and 2: `run(rows, concurrency)` → wall seconds of the stage over the first `rows` rows, cold.

    Returns the sequential baseline's walls (seq_n rows at concurrency 1), its calls per second, and per
    concurrency C the median of `repeats` runs over n rows against the bound calls·L/C, with the speedup over
    the baseline (ideal: C)."""
    seq_walls = [run(seq_n, 1) for _ in range(repeats)]
    seq_rate = calls_per_row * seq_n / median(seq_walls)
    results = []
    for c in concurrencies:
        walls = [run(n, c) for _ in range(repeats)]
        rate = calls_per_row * n / median(walls)
        results.append({**against_bound(c, walls, calls_per_row * n * latency / c), rate_key: round(rate, 2),
                        "speedup_vs_sequential": round(rate / seq_rate, 2), "ideal_speedup": c})
        print(json.dumps(results[-1]))
    return seq_walls, seq_rate, results


def write_result(name: str, data: dict) -> Path:
    from qrewrite.io_utils import write_json

    path = RESULTS / f"{name}.json"
    write_json(path, {"bench": name, "machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **data})
    return path


def mean_text(m: dict, ci: bool = False) -> str:
    """A figure (qrewrite.eval.stats.mean_ci) as the studies' tables print it: the mean, with `ci` its interval."""
    if m.get("mean") is None:
        return "–"
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if ci else f"{m['mean']:.3f}"


def paired_text(d: dict) -> str:
    """A paired difference (qrewrite.eval.stats.paired) as the studies' tables print it."""
    return (f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] ({d['a_better']} better, "
            f"{d['b_better']} worse)" if d.get("diff") is not None else "–")


def study_args(doc: str, *, required: tuple[str, ...] = ("tenant",),
               add: Callable[[argparse.ArgumentParser], None] | None = None,
               table: Callable[[], str]) -> argparse.Namespace | None:
    """The quality studies' command line: --project (the folder the pipeline ran in), --tenant, the study's own
    flags (`add`), and --table, which prints every stored result (`table`) and returns None."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--project", type=Path, default=REPO, help="the project folder the pipeline ran in")
    ap.add_argument("--tenant")
    if add:
        add(ap)
    ap.add_argument("--table", action="store_true", help="print the table of every result")
    args = ap.parse_args()
    if args.table:
        print(table())
        return None
    missing = [f"--{r.replace('_', '-')}" for r in required if not getattr(args, r)]
    if missing:
        ap.error(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or --table)")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A loopback server subprocess, stopped on exit."""

    def __init__(self, cmd: list[str], health_url: str, cwd: Path, log: Path, timeout: float = 60):
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited: {Path(log).read_text()[-2000:]}")
            try:
                if httpx.get(health_url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise TimeoutError(f"{health_url} did not come up")
            time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Scripted:
    """A fake server's script file and request log (see the fakes' docstrings)."""

    def __init__(self, server: Server, url: str, state: Path):
        self.server, self.url, self.state = server, url, state

    def script(self, **behaviour) -> None:
        (self.state / "script.json").write_text(json.dumps(behaviour))

    def requests(self) -> list[dict]:
        log = self.state / "requests.jsonl"
        return [json.loads(l) for l in log.read_text().splitlines() if l.strip()] if log.exists() else []

    def stop(self):
        self.server.stop()


def fake_openai(workdir: Path) -> Scripted:
    state = workdir / "fake_openai"
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    srv = Server([sys.executable, str(TESTS / "fake_openai_server.py"), "--port", str(port), "--state", str(state)],
                 f"http://127.0.0.1:{port}/health", workdir, workdir / "fake_openai.log")
    return Scripted(srv, f"http://127.0.0.1:{port}/v1", state)


def fault_rag(project: Path, workdir: Path) -> Scripted:
    state = workdir / "fault_rag"
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    srv = Server([sys.executable, str(TESTS / "fault_rag_server.py"), "--config", "config.yaml", "--port", str(port),
                  "--state", str(state)], f"http://127.0.0.1:{port}/healthz", project, workdir / "fault_rag.log")
    return Scripted(srv, f"http://127.0.0.1:{port}", state)


def scratch_project(root: Path) -> Path:
    """A copy of the project's config and data to run stages or Snakemake in."""
    shutil.copytree(REPO / "data" / "kb", root / "data" / "kb")
    shutil.copytree(REPO / "data" / "demo", root / "data" / "demo")
    shutil.copy(REPO / "config.yaml", root / "config.yaml")
    return root


def update_config(root: Path, **sections) -> None:
    import yaml

    path = root / "config.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")


def snakemake(root: Path, *args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(root), "--configfile",
           str(root / "config.yaml"), "--cores", "2", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return proc


def qrewrite(root: Path, *args: str, env: dict | None = None) -> float:
    """Run one `qrewrite` command in `root`; return its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qrewrite", *args], cwd=root, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"qrewrite {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall


def config_for(root: Path, tenant: str = "fivedoctors") -> tuple[dict, dict]:
    """The validated config of a scratch project with its relative paths made absolute (for in-process runs)."""
    from qrewrite.config import load_config, tenant_config

    cfg = load_config(root / "config.yaml")
    for t in cfg["tenants"]:
        t["kb"]["path"] = str(root / t["kb"]["path"])
    return cfg, tenant_config(cfg, tenant)


def synthetic_queries(n: int, tenant: str = "fivedoctors") -> list[dict]:
    """n query rows with distinct question text, built from the demo source (each gets a " #i" suffix, so
    no two rows share a RAG search and every row costs exactly its calls)."""
    src = [json.loads(l) for l in (REPO / "data" / "demo" / f"{tenant}.queries.jsonl").read_text(
        encoding="utf-8").splitlines() if l.strip()]
    rows = []
    for i in range(n):
        s = src[i % len(src)]
        q = f"{s['query']} #{i}"
        rows.append({"id": f"q{i:05d}", "tenant": tenant, "row": i + 2, "query": q, "profile": s["profile"],
                     "history": s["history"], "gold_doc_ids": s["gold_doc_ids"]})
    return rows
