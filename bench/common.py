"""Shared helpers for the benchmarks: the command line (--quick, --results), machine facts, medians, result files,
loopback servers.

The servers are the TEST FAKES from tests/ (tests/servers.py: an OpenAI-compatible server with a fixed injected
latency, and the real RAG app behind a wrapper that adds latency): benchmarks measure how close the pipeline gets to
the bound the services it calls allow, so the services' own speed is pinned.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.servers import Scripted, start_fake_openai, start_fault_rag

REPO = Path(__file__).resolve().parents[1]
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
                      repeats: int, latency: float, calls: Callable[[int], int], rate_key: str) -> tuple[list[float], float,
                                                                                               list[dict]]:
    """Benches 1 and 2: `run(rows, concurrency)` → wall seconds of the stage over the first `rows` rows, cold;
    `calls(rows)`: the service calls those rows cost.

    Returns the sequential baseline's walls (seq_n rows at concurrency 1), its calls per second, and per
    concurrency C the median of `repeats` runs over n rows against the bound calls·L/C, with the speedup over
    the baseline (ideal: C)."""
    seq_walls = [run(seq_n, 1) for _ in range(repeats)]
    seq_rate = calls(seq_n) / median(seq_walls)
    results = []
    for c in concurrencies:
        walls = [run(n, c) for _ in range(repeats)]
        rate = calls(n) / median(walls)
        results.append({**against_bound(c, walls, calls(n) * latency / c), rate_key: round(rate, 2),
                        "speedup_vs_sequential": round(rate / seq_rate, 2), "ideal_speedup": c})
        print(json.dumps(results[-1]))
    return seq_walls, seq_rate, results


def bench_args(ap: argparse.ArgumentParser, quick: dict | None, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a bench's command line with its two common flags: --results DIR (where its result file goes, default
    bench/results) and --quick, a smoke run at the sizes in `quick` (flags given as well still win): it checks that
    the bench runs, in seconds, and its file says `"quick": true`, not a number for the tables. `quick` None: the
    bench has no quick mode (it reads a finished run)."""
    if quick is not None:
        sizes = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items()) or "the command given"
        ap.add_argument("--quick", action="store_true", help=f"a smoke run ({sizes}): not a number for the tables")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the folder the result file goes to")
    if quick and ap.parse_known_args(argv)[0].quick:
        ap.set_defaults(**quick)
    return ap.parse_args(argv)


def write_result(name: str, data: dict, args: argparse.Namespace | None = None) -> Path:
    """bench/results/<name>.json, or under `args.results`; a --quick run is marked as one."""
    from qrewrite.io_utils import write_json

    results, quick = (args.results, getattr(args, "quick", False)) if args is not None else (RESULTS, False)
    path = results / f"{name}.json"
    write_json(path, {"bench": name, "machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      **({"quick": True} if quick else {}), **data})
    return path


def fake_openai(workdir: Path) -> Scripted:
    return start_fake_openai(workdir)


def fault_rag(project: Path, workdir: Path) -> Scripted:
    return start_fault_rag(project, workdir)


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
