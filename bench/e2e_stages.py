"""Bench 6: wall time of the embedded end-to-end run, per stage, from Snakemake's own benchmark files.

Every rule writes benchmarks/{tenant}/{rule}.tsv; this runs Snakemake in a fresh scratch project
(embedded defaults) --repeats times and reports, per rule and tenant, the median of the `s` column
(plus CPU time and peak RSS). It takes every rule whose benchmark file exists after the run. The
target defaults to the data half (`snakemake data`); --all runs the default target (every stage).

    .venv/bin/python -m bench.e2e_stages [--repeats 3] [--all]
    .venv/bin/python -m bench.e2e_stages --from-run /path/to/clone --wall-s 1234   # a finished `make run`

The full embedded run trains two models per tenant (tens of minutes on 2 cores), so --from-run reads the
benchmark files a finished `make run` left behind: one run, no median.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.common import bench_args, median, scratch_project, snakemake, write_result


def read_benchmarks(root: Path) -> dict[str, dict]:
    out = {}
    for tsv in sorted((root / "benchmarks").rglob("*.tsv")):
        with open(tsv, newline="") as fh:
            row = next(csv.DictReader(fh, delimiter="\t"))
        name = str(tsv.relative_to(root / "benchmarks").with_suffix(""))  # e.g. fivedoctors/teacher

        def num(key):
            try:
                return float(row[key])
            except (KeyError, ValueError):
                return None

        out[name] = {"s": num("s"), "cpu_time_s": num("cpu_time"), "max_rss_mb": num("max_rss")}
    return out


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"repeats": 1, "only": "fivedoctors"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--all", action="store_true", help="run the default target (every stage) instead of the data half")
    ap.add_argument("--only", help="one tenant's part of the run (snakemake --config only=NAME; default both)")
    ap.add_argument("--from-run", type=Path, help="read benchmarks/ of a finished run in this folder (runs nothing)")
    ap.add_argument("--wall-s", type=float, help="with --from-run: the run's measured wall time")
    ap.add_argument("--run-note", help="with --from-run: how the run was measured (fresh clone? idle cores?)")
    args = bench_args(ap, quick=QUICK)
    if args.from_run:
        table = read_benchmarks(args.from_run)
        if not table:
            raise SystemExit(f"no benchmark files under {args.from_run / 'benchmarks'}: run `make run` there first")
        result = {"what": "one finished `make run` (embedded defaults, every stage, both tenants), per rule from "
                          "benchmarks/{tenant}/{rule}.tsv", "targets": "default target (all stages)", "repeats": 1,
                  "total_wall_s": args.wall_s, "sum_of_rules_s": round(sum(v["s"] or 0 for v in table.values()), 1),
                  # the machine record below is taken now, when the files are read, not during the run
                  "run_finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(max(
                      f.stat().st_mtime for f in (args.from_run / "benchmarks").rglob("*.tsv")))),
                  "run_note": args.run_note,
                  "per_rule": {k: {**v, "runs": 1} for k, v in table.items()}}
        print(json.dumps(result, indent=1))
        write_result("e2e_stages_full", result, args)
        return
    runs, walls = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            root = scratch_project(Path(tmp) / "proj")
            targets = ([] if args.all else ["data"]) + (["--config", f"only={args.only}"] if args.only else [])
            t0 = time.perf_counter()
            snakemake(root, *targets)
            walls.append(time.perf_counter() - t0)
            runs.append(read_benchmarks(root))
    per_rule = defaultdict(list)
    for r in runs:
        for name, v in r.items():
            per_rule[name].append(v)
    table = {name: {"s": median([v["s"] for v in vs if v["s"] is not None]),
                    "cpu_time_s": median([v["cpu_time_s"] for v in vs if v["cpu_time_s"] is not None] or [0]),
                    "max_rss_mb": median([v["max_rss_mb"] for v in vs if v["max_rss_mb"] is not None] or [0]),
                    "runs": len(vs)} for name, vs in sorted(per_rule.items())}
    result = {"what": "embedded end-to-end run in a scratch project (`snakemake --cores 2`), per rule from "
                      "benchmarks/{tenant}/{rule}.tsv",
              "targets": ("default target (all stages)" if args.all else "`data` (the data half)")
              + f", {args.only or 'both tenants'}",
              "repeats": args.repeats, "total_wall_s": median(walls), "total_walls_s": [round(w, 2) for w in walls],
              "per_rule": table}
    print(json.dumps(result, indent=1))
    write_result("e2e_stages", result, args)


if __name__ == "__main__":
    main()
