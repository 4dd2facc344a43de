"""Bench 2: RAG-validation throughput against the HTTP RAG service with a fixed injected latency.

The validation stage (`run_validation`, in-process, cold cache) sends a search per distinct text of a row (the
teacher's rewrite, the raw query, query + history, ...: S searches for N rows, counted by the stage) to the real RAG
app behind tests/fault_rag_server.py, which adds latency L. For each concurrency C (rag.concurrency): wall time as a
ratio to the bound S*L/C, and the speedup over a sequential baseline (C = 1) measured in the same run. Also `qrewrite validate` as a rule runs it.
Medians over --repeats.

    .venv/bin/python -m bench.rag_throughput [--n 1000] [--latency 0.2] [--concurrency 10 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path

from bench.common import (against_bound, bench_args, concurrency_sweep, config_for, fault_rag, qrewrite,
                          scratch_project, synthetic_queries, update_config, write_result)


def teacher_rows(queries: list[dict]) -> list[dict]:
    return [{"id": q["id"], "status": "ok", "rewrite": f"{q['query']} 用法用量"} for q in queries]


def run_stage(cfg: dict, tenant: dict, queries: list[dict], concurrency: int, cache_dir: Path,
              calls: dict[int, int]) -> float:
    """The stage over `queries`, cold; the searches it made are recorded in `calls` (by row count) and must be the
    same every time."""
    from qrewrite.rag.validate import run_validation

    cfg["rag"]["concurrency"] = concurrency
    cfg["rag"]["cache_dir"] = str(cache_dir)
    t0 = time.perf_counter()
    rows, stats = asyncio.run(run_validation(cfg, tenant, queries, teacher_rows(queries), progress=False))
    wall = time.perf_counter() - t0
    assert len(rows) == len(queries) and calls.setdefault(len(queries), stats["rag_calls"]) == stats["rag_calls"], stats
    return wall


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"n": 50, "latency": 0.05, "repeats": 1, "seq_n": 5, "concurrency": [10]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="rows (2 searches each)")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--seq-n", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    args = bench_args(ap, quick=QUICK)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = scratch_project(tmp / "proj")
        server = fault_rag(root, tmp)
        try:
            update_config(root, rag={"provider": "http", "http": {"base_url": server.url, "backoff_base_s": 0.0}})
            cfg, tenant = config_for(root)
            queries = synthetic_queries(args.n)
            # Unloaded service time per search (BM25 on the server, HTTP, JSON), for reference.
            server.script()
            calls: dict[int, int] = {}
            warm_n = min(100, args.n)
            t0 = time.perf_counter()
            run_stage(cfg, tenant, queries[:warm_n], 1, tmp / "warmup", calls)
            service_s = (time.perf_counter() - t0) / calls[warm_n]
            # the searches of the n and seq_n rows, counted by the stage (no latency): the bounds need them first
            for rows in {args.n, args.seq_n}:
                run_stage(cfg, tenant, queries[:rows], max(args.concurrency), tmp / f"count{rows}", calls)
            server.script(latency_s=args.latency)
            caches = (tmp / f"cache{i}" for i in itertools.count(1))  # a cold cache for every run
            seq_walls, seq_sps, results = concurrency_sweep(
                lambda rows, c: run_stage(cfg, tenant, queries[:rows], c, next(caches), calls), n=args.n, seq_n=args.seq_n,
                concurrencies=args.concurrency, repeats=args.repeats, latency=args.latency, calls=calls.__getitem__,
                rate_key="searches_per_s")
            c = args.concurrency[0]
            from qrewrite.io_utils import write_jsonl

            write_jsonl(root / "queries.jsonl", queries)
            write_jsonl(root / "teacher.jsonl", teacher_rows(queries))
            cli_walls = []
            for i in range(args.repeats):
                update_config(root, rag={"concurrency": c, "cache_dir": f"cache/cli{i}"})
                cli_walls.append(qrewrite(root, "validate", "--config", "config.yaml", "--tenant", "fivedoctors",
                                          "--queries", "queries.jsonl", "--teacher", "teacher.jsonl", "--out",
                                          f"v{i}.jsonl", "--stats", f"s{i}.json", "--no-progress"))
        finally:
            server.stop()
    cli = against_bound(c, cli_walls, calls[args.n] * args.latency / c)
    print(json.dumps({"cli": cli}))
    write_result("rag_throughput", {
        "what": "validation stage (http provider) against the real RAG app with injected latency L",
        "n_rows": args.n, "searches": calls[args.n], "latency_s": args.latency, "repeats": args.repeats,
        "unloaded_service_s_per_search": round(service_s, 4),
        "sequential": {"n_rows": args.seq_n, "walls_s": [round(w, 3) for w in seq_walls],
                       "searches_per_s": round(seq_sps, 2)},
        "in_process": results, "cli": cli, "target": "ratio_to_bound >= 0.9"}, args)


if __name__ == "__main__":
    main()
