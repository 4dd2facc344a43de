"""Bench 2: RAG-validation throughput against the HTTP RAG service with a fixed injected latency.

The validation stage (`run_validation`, in-process, cold cache) sends 2 searches per row (rewrite
and raw query) to the real RAG app behind tests/fault_rag_server.py, which adds latency L. For each
concurrency C (rag.concurrency): wall time as a ratio to the bound 2*N*L/C, and the speedup over a
sequential baseline (C = 1) measured in the same run. Also `qrewrite validate` as a rule runs it.
Medians over --repeats.

    .venv/bin/python bench/rag_throughput.py [--n 1000] [--latency 0.2] [--concurrency 10 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path

from common import (against_bound, concurrency_sweep, config_for, fault_rag, qrewrite, scratch_project,
                    synthetic_queries, update_config, write_result)


def teacher_rows(queries: list[dict]) -> list[dict]:
    return [{"id": q["id"], "status": "ok", "rewrite": f"{q['query']} 用法用量"} for q in queries]


def run_stage(cfg: dict, tenant: dict, queries: list[dict], concurrency: int, cache_dir: Path) -> float:
    from qrewrite.rag.validate import run_validation

    cfg["rag"]["concurrency"] = concurrency
    cfg["rag"]["cache_dir"] = str(cache_dir)
    t0 = time.perf_counter()
    rows, stats = asyncio.run(run_validation(cfg, tenant, queries, teacher_rows(queries), progress=False))
    wall = time.perf_counter() - t0
    assert stats["rag_calls"] == 2 * len(queries) and len(rows) == len(queries), stats
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="rows (2 searches each)")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--seq-n", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
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
            t0 = time.perf_counter()
            run_stage(cfg, tenant, queries[:100], 1, tmp / "warmup")
            service_s = (time.perf_counter() - t0) / 200
            server.script(latency_s=args.latency)
            caches = (tmp / f"cache{i}" for i in itertools.count(1))  # a cold cache for every run
            seq_walls, seq_sps, results = concurrency_sweep(
                lambda rows, c: run_stage(cfg, tenant, queries[:rows], c, next(caches)), n=args.n, seq_n=args.seq_n,
                concurrencies=args.concurrency, repeats=args.repeats, latency=args.latency, calls_per_row=2,
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
    cli = against_bound(c, cli_walls, 2 * args.n * args.latency / c)
    print(json.dumps({"cli": cli}))
    write_result("rag_throughput", {
        "what": "validation stage (http provider) against the real RAG app with injected latency L",
        "n_rows": args.n, "searches": 2 * args.n, "latency_s": args.latency, "repeats": args.repeats,
        "unloaded_service_s_per_search": round(service_s, 4),
        "sequential": {"n_rows": args.seq_n, "walls_s": [round(w, 3) for w in seq_walls],
                       "searches_per_s": round(seq_sps, 2)},
        "in_process": results, "cli": cli, "target": "ratio_to_bound >= 0.9"})


if __name__ == "__main__":
    main()
