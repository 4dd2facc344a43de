"""Every maintained benchmark in bench/ still runs: each one's --quick mode (small N, one repeat), as `python -m
bench.<name>` from the repo root, writing into a tmp folder, never into bench/results. A bench that needs a finished
run's trained models has no quick mode and is named in EXEMPT with why; it is still imported and its command line
parsed (`--help`), so a module it imports that moved fails here. Dated studies (studies/) are pinned and not run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

# bench/*.py that are not benchmarks: the shared helpers, `make bench`'s driver and the two renderers (report.py,
# figures.py: tests/test_figures.py runs both)
HELPERS = {"__init__", "common", "run_all", "report", "figures"}

# bench -> extra arguments of its quick run (timed_run times the command it is given)
QUICK = {
    "teacher_throughput": [],
    "rag_throughput": [],
    "rerun_cost": [],
    "noop_dryrun": [],
    "reward_throughput": [],
    "e2e_stages": [],
    "timed_run": ["--name", "smoke", "--", sys.executable, "-c", "print('timed')"],
}

EXEMPT = {
    "serve_engine": "loads a finished run's released models in the swift env and serves them at concurrency up to 32 "
                    "(make bench-serve); tests/test_serve.py and tests/test_engine.py check the gateway and the engine",
    "serve_tenants": "copies a finished run's release into up to 8 model tenants of one gateway (make bench-serve)",
    "rl_check": "trains SFT and GRPO on a tenant (make rl-check, tens of minutes); tests/test_pipeline_e2e.py runs the "
                "rl stage and its check against SFT on the tiny model",
    "tenant_figures": "reads a finished run's release.json, eval.json and deploy.json; tests/test_figures.py checks "
                      "what is rendered from its stored files",
}


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_every_bench_has_a_quick_mode_or_says_why_not():
    """A bench added to bench/ without a quick run here, or an entry for a bench that is gone, fails."""
    benches = {p.stem for p in (REPO / "bench").glob("*.py")} - HELPERS
    assert benches == set(QUICK) | set(EXEMPT)
    assert not set(QUICK) & set(EXEMPT)
    from bench import run_all

    assert set(run_all.BENCHES) <= set(QUICK), "make bench runs a bench this file does not smoke-run"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_mode_runs_and_writes_its_result_elsewhere(name, tmp_path):
    stored = {p: p.read_bytes() for p in (REPO / "bench" / "results").glob("*.json")}
    proc = run([f"bench.{name}", "--quick", "--results", str(tmp_path), *QUICK[name]])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text(encoding="utf-8"))
    assert doc["quick"] is True and doc["bench"] == files[0].stem and doc["machine"]["commit"]
    if name == "timed_run":
        assert doc["rc"] == 0 and "timed" in (tmp_path / "timing_smoke.log").read_text(encoding="utf-8")
    # bench/results holds the measured runs only: a quick run leaves every stored file as it was
    assert {p: p.read_bytes() for p in (REPO / "bench" / "results").glob("*.json")} == stored


@pytest.mark.parametrize("name", sorted(EXEMPT))
def test_an_exempt_bench_still_imports_and_parses_its_command_line(name):
    proc = run([f"bench.{name}", "--help"], timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]
