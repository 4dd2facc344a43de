"""Bench 1: teacher-stage throughput against the test OpenAI server with a fixed injected latency.

For each concurrency C: N queries through `run_teacher` (the stage's core, in-process, cold cache),
wall time as a ratio to the bound N*L/C (1.0 = the service's latency is the only cost), and as a
speedup over a sequential one-request-at-a-time baseline measured in the same run (ideal: C). Also
the stage as Snakemake runs it (`qrewrite teacher`, a fresh process: imports and file I/O included).
Medians over --repeats.

    .venv/bin/python -m bench.teacher_throughput [--n 1000] [--latency 0.2] [--concurrency 10 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path

from bench.common import (against_bound, bench_args, concurrency_sweep, config_for, fake_openai, qrewrite,
                          scratch_project, synthetic_queries, update_config, write_result)

KEY = {"QR_BENCH_KEY": "sk-bench-not-a-real-key"}


def run_stage(cfg: dict, tenant: dict, queries: list[dict], concurrency: int, cache_dir: Path) -> float:
    from qrewrite.teacher.stage import run_teacher

    cfg["teacher"]["concurrency"] = concurrency
    cfg["teacher"]["cache_dir"] = str(cache_dir)
    t0 = time.perf_counter()
    rows, stats = asyncio.run(run_teacher(cfg, tenant, queries, progress=False))
    wall = time.perf_counter() - t0
    assert stats["new_calls"] == len(queries) and stats["failed_calls"] == 0, stats
    return wall


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"n": 50, "latency": 0.05, "repeats": 1, "seq_n": 5, "concurrency": [10]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--seq-n", type=int, default=50, help="queries in the sequential baseline")
    ap.add_argument("--repeats", type=int, default=3)
    args = bench_args(ap, quick=QUICK)
    import os

    os.environ.update(KEY)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = scratch_project(tmp / "proj")
        server = fake_openai(tmp)
        try:
            server.script(latency_s=args.latency)
            update_config(root, teacher={"provider": "openai", "openai": {
                "base_url": server.url, "model": "bench", "api_key_env": "QR_BENCH_KEY", "backoff_base_s": 0.0}})
            cfg, tenant = config_for(root)
            queries = synthetic_queries(args.n)
            caches = (tmp / f"cache{i}" for i in itertools.count(1))  # a cold cache for every run
            seq_walls, seq_qps, results = concurrency_sweep(
                lambda rows, c: run_stage(cfg, tenant, queries[:rows], c, next(caches)), n=args.n, seq_n=args.seq_n,
                concurrencies=args.concurrency, repeats=args.repeats, latency=args.latency, calls=lambda rows: rows,
                rate_key="queries_per_s")
            # The stage as a rule runs it: one `qrewrite teacher` process, cold cache.
            c = args.concurrency[0]
            update_config(root, teacher={"concurrency": c})
            (root / "data/raw").mkdir(parents=True, exist_ok=True)
            from qrewrite.io_utils import write_jsonl

            write_jsonl(root / "queries.jsonl", queries)
            cli_walls = []
            for i in range(args.repeats):
                update_config(root, teacher={"cache_dir": f"cache/cli{i}"})
                cli_walls.append(qrewrite(root, "teacher", "--config", "config.yaml", "--tenant", "fivedoctors",
                                          "--queries", "queries.jsonl", "--out", f"t{i}.jsonl", "--stats",
                                          f"s{i}.json", "--no-progress"))
            calls = len(server.requests())
        finally:
            server.stop()
    cli = against_bound(c, cli_walls, args.n * args.latency / c)
    print(json.dumps({"cli": cli}))
    write_result("teacher_throughput", {
        "what": "teacher stage (openai provider) against the test OpenAI server with injected latency L",
        "n": args.n, "latency_s": args.latency, "repeats": args.repeats,
        "sequential": {"n": args.seq_n, "walls_s": [round(w, 3) for w in seq_walls], "queries_per_s": round(seq_qps, 2),
                       "per_query_s": round(1 / seq_qps, 4)},
        "in_process": results, "cli": cli, "server_requests": calls, "target": "ratio_to_bound >= 0.9"}, args)


if __name__ == "__main__":
    main()
