"""Run every benchmark of `make bench` (each writes bench/results/<name>.json), then refresh the tables in
bench/README.md and docs/benchmarks.md.

    .venv/bin/python -m bench.run_all [--quick] [--only teacher_throughput rag_throughput ...]

--quick runs each bench's own --quick (small N, one repeat: a smoke run, numbers not for the tables) into a
temporary folder (or --results DIR) and leaves bench/results and the tables alone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, RESULTS

BENCHES = ("teacher_throughput", "rag_throughput", "rerun_cost", "noop_dryrun", "reward_throughput", "e2e_stages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=BENCHES)
    ap.add_argument("--results", type=Path, help="the folder for the result files (default bench/results; with "
                                                 "--quick a temporary folder)")
    args = ap.parse_args()
    results = args.results or (Path(tempfile.mkdtemp(prefix="bench-quick-")) if args.quick else RESULTS)
    failed = []
    for name in BENCHES:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", f"bench.{name}", "--results", str(results),
                               *(["--quick"] if args.quick else [])], cwd=REPO)
        print(f"== {name}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        if proc.returncode:
            failed.append(name)
    if results == RESULTS:
        subprocess.run([sys.executable, "-m", "bench.report"], cwd=REPO, check=True)
    else:
        print(f"results in {results} (bench/results and the tables left alone)")
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
