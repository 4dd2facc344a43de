"""Run every benchmark (each writes bench/results/<name>.json), then refresh the tables in bench/README.md and
docs/benchmarks.md.

    .venv/bin/python bench/run_all.py [--quick] [--only teacher_throughput rag_throughput ...]

--quick shrinks N and the repeats (a smoke run: numbers not for the tables).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = {
    "teacher_throughput": ["--n", "200", "--latency", "0.05", "--repeats", "1", "--seq-n", "10"],
    "rag_throughput": ["--n", "200", "--latency", "0.05", "--repeats", "1", "--seq-n", "10"],
    "rerun_cost": ["--latency", "0.02", "--rag-latency", "0.01", "--repeats", "1"],
    "noop_dryrun": ["--repeats", "2"],
    "reward_throughput": ["--repeats", "1"],
    "e2e_stages": ["--repeats", "1"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHES))
    args = ap.parse_args()
    failed = []
    for name, quick_args in BENCHES.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *(quick_args if args.quick else [])])
        print(f"== {name}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        if proc.returncode:
            failed.append(name)
    subprocess.run([sys.executable, str(HERE / "report.py")], check=True)
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
