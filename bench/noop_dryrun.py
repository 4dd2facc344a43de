"""Bench 4: `snakemake -n` on a completed run (target < 3 s), with where the time goes.

Runs the embedded pipeline once in a scratch project (the data half, `snakemake data`; --all: every
stage), then times `snakemake -n` for the same target --repeats times (median), `snakemake
--version` (interpreter + import floor), and profiles one dry run with cProfile (top functions by
cumulative time). The dry run builds the whole workflow (every rule file is parsed) either way.

    .venv/bin/python -m bench.noop_dryrun [--repeats 5] [--all]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BIN, REPO, bench_args, median, scratch_project, snakemake, write_result


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    if "-n" in cmd and "Nothing to be done" not in proc.stdout + proc.stderr:
        raise RuntimeError(f"the run is not complete:\n{proc.stdout[-3000:]}")
    return wall


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"repeats": 1, "only": "fivedoctors"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--all", action="store_true", help="complete and dry-run the default target (every stage)")
    ap.add_argument("--only", help="one tenant's part of the run (snakemake --config only=NAME; default both)")
    args = bench_args(ap, quick=QUICK)
    target = ([] if args.all else ["data"]) + (["--config", f"only={args.only}"] if args.only else [])
    with tempfile.TemporaryDirectory() as tmp:
        root = scratch_project(Path(tmp) / "proj")
        snakemake(root, *target)
        dry = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(root), "--configfile",
               str(root / "config.yaml"), "--cores", "2", "-n", *target]
        walls = [timed(dry, root) for _ in range(args.repeats)]
        floor = [timed([str(BIN / "snakemake"), "--version"], root) for _ in range(args.repeats)]
        # One dry run under cProfile, in a child interpreter (snakemake's entry point, same arguments).
        prof_path = Path(tmp) / "dry.prof"
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof_path), "-m", "snakemake", *dry[1:]],
                       cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
        top = []
        if prof_path.exists():
            out = io.StringIO()
            stats = pstats.Stats(str(prof_path), stream=out)
            total = stats.total_tt
            for (file, line, fn), (cc, nc, tt, ct, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:40]:
                top.append({"function": f"{Path(file).name}:{line}({fn})", "cumulative_s": round(ct, 3)})
            profile = {"total_s": round(total, 3), "top_cumulative": top}
        else:
            profile = {"error": "cProfile run produced no profile"}
    result = {"what": f"`snakemake -n {' '.join(target)}` on a completed run of that target (embedded defaults, "
                      f"{args.only or 'both tenants'})",
              "repeats": args.repeats, "dry_run_walls_s": [round(w, 3) for w in walls],
              "dry_run_median_s": median(walls),
              "snakemake_version_median_s": median(floor), "target": "dry_run_median_s < 3", "profile": profile}
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}))
    write_result("noop_dryrun", result, args)


if __name__ == "__main__":
    main()
