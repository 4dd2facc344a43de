"""Time one command as a user runs it and store the run: bench/results/timing_<name>.json (the command, its exit
code, wall seconds, start and end, the commit, the machine: CPU model, bf16 units or not, cores, load at start).

    .venv/bin/python -m bench.timed_run --name make_run -- make run          # in a fresh clone: install included
    .venv/bin/python -m bench.timed_run --name ci_run --cwd /tmp/clone -- bash .ci/run

The command's own output goes to bench/results/timing_<name>.log beside it (the last lines are kept in the JSON).
A failed command is stored too (rc != 0): a timing is only a figure when rc is 0, which bench/figures.py checks.
--quick marks the file as a smoke run (tests/test_bench_quick.py times a one-line command into --results).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.common import REPO, bench_args, machine, write_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="result name: bench/results/timing_<name>.json")
    ap.add_argument("--cwd", default=".", help="where to run it (a fresh clone for `make run` from scratch)")
    ap.add_argument("--note", default="", help="what else a reader should know (e.g. 'pip cache warm')")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = bench_args(ap, quick={})
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    cwd = Path(args.cwd).resolve()
    log = args.results / f"timing_{args.name}.log"
    # the machine and commit of the checkout that runs the command (a clone's own commit)
    here = os.getcwd()
    os.chdir(cwd)
    facts = machine()
    git = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                           text=True)
    os.chdir(here)
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        rc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
    path = write_result(f"timing_{args.name}", {
        "command": " ".join(cmd), "cwd": str(cwd), "rc": rc, "wall_s": round(wall, 1),
        "wall_min": round(wall / 60, 1), "started": started.isoformat(timespec="seconds"),
        "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_commit": git.stdout.strip() or None, "run_dirty": bool(dirty.stdout.strip()),
        "run_machine": facts, "note": args.note, "log": str(log.resolve().relative_to(REPO) if log.resolve().is_relative_to(REPO) else log),
        "log_tail": tail}, args)
    print(f"{' '.join(cmd)}: rc {rc} in {wall / 60:.1f} min -> {path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
