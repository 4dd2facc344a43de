"""Where CI's time goes: the phases of a `.ci/run` log (its `[ci] before STEP, N s in` lines) and the per-file
times of its `make test` (the JSON tests/conftest.py writes where QREWRITE_TEST_PROFILE points; .ci/run keeps it
as test-profile.json in the clone), as the markdown tables of docs/benchmarks.md.

    python bench/ci_profile.py --log ci.log --profile test-profile.json [--top 25]

Writes bench/results/ci_profile.json (phases, files, totals) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import write_result  # noqa: E402

PHASE = re.compile(r"^\[ci\] before ([\w-]+), (\d+) s in")
END = re.compile(r"^rc=(\d+) wall=(\d+)$")  # appended by whoever timed the run (docs/benchmarks.md)


def phases(log: str) -> tuple[list[dict], dict]:
    """Each step from its `before` line to the next one's; the last ends where the run's wall time says."""
    marks = [(m.group(1), int(m.group(2))) for m in map(PHASE.match, log.splitlines()) if m]
    end = next((m for m in map(END.match, log.splitlines()) if m), None)
    out = []
    for (name, t), nxt in zip(marks, marks[1:] + [None]):
        until = nxt[1] if nxt else (int(end.group(2)) if end else None)
        if name != "end":
            out.append({"step": name, "start_s": t, "s": None if until is None else until - t})
    return out, {"rc": int(end.group(1)) if end else None, "wall_s": int(end.group(2)) if end else None}


def table(doc: dict, top: int) -> str:
    lines = ["| `.ci/run` step | start (min) | took (min) |", "|---|---:|---:|"]
    for p in doc["phases"]:
        took = "–" if p["s"] is None else f"{p['s'] / 60:.1f}"
        lines.append(f"| {p['step']} | {p['start_s'] / 60:.1f} | {took} |")
    if doc["run"]["wall_s"]:
        lines.append(f"| **all** (exit {doc['run']['rc']}) | | **{doc['run']['wall_s'] / 60:.1f}** |")
    prof = doc["tests"]
    lines += ["", f"`make test`: {prof['wall_s'] / 60:.1f} min of wall clock on two workers, "
              f"{prof['worker_s'] / 60:.1f} worker-minutes. Per file (worker seconds; setup holds the module "
              "fixtures, the largest single setup apart):", "",
              "| file | tests | total (s) | setup (s) | largest setup (s) | call (s) |", "|---|---:|---:|---:|---:|---:|"]
    rows = prof["files"]
    for r in rows[:top]:
        lines.append(f"| {r['file']} | {r['tests']} | {r['total']:.0f} | {r['setup']:.0f} | {r['max_setup']:.0f} | "
                     f"{r['call']:.0f} |")
    rest = rows[top:]
    if rest:
        lines.append(f"| {len(rest)} other files | {sum(r['tests'] for r in rest)} | "
                     f"{sum(r['total'] for r in rest):.0f} | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, required=True, help="the .ci/run console log")
    ap.add_argument("--profile", type=Path, required=True, help="test-profile.json of the same run")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    steps, run = phases(args.log.read_text(encoding="utf-8", errors="replace"))
    prof = json.loads(args.profile.read_text(encoding="utf-8"))
    doc = {"phases": steps, "run": run,
           "tests": {"wall_s": prof["wall_s"], "worker_s": round(sum(r["total"] for r in prof["files"]), 1),
                     "files": prof["files"]}}
    write_result("ci_profile", doc)
    print(table(doc, args.top))


if __name__ == "__main__":
    main()
