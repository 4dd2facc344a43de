"""Bench 3: cost of a rerun with a warm cache: paid calls (target 0) and wall time.

The data half (`snakemake data`) runs through Snakemake in a scratch project with the OpenAI teacher (test server,
latency --latency) and the HTTP RAG service (real RAG app behind the fault wrapper, latency
--rag-latency): once cold, then --repeats times with `--forceall` (every rule reruns, the caches are
warm). Paid calls are counted on the servers.

    .venv/bin/python -m bench.rerun_cost [--latency 0.2] [--rag-latency 0.05] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.common import (bench_args, fake_openai, fault_rag, median, scratch_project, snakemake, update_config,
                          write_result)

KEY = {"QR_BENCH_KEY": "sk-bench-not-a-real-key"}


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"latency": 0.02, "rag_latency": 0.01, "repeats": 1, "only": "fivedoctors"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--rag-latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", help="one tenant's part of the run (snakemake --config only=NAME; default both)")
    args = bench_args(ap, quick=QUICK)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = scratch_project(tmp / "proj")
        teacher, rag = fake_openai(tmp), fault_rag(root, tmp)
        try:
            teacher.script(latency_s=args.latency)
            rag.script(latency_s=args.rag_latency)
            update_config(root, teacher={"provider": "openai", "openai": {
                "base_url": teacher.url, "model": "bench", "api_key_env": "QR_BENCH_KEY", "backoff_base_s": 0.0}},
                rag={"provider": "http", "http": {"base_url": rag.url, "backoff_base_s": 0.0}})
            t0 = time.perf_counter()
            targets = ["data", *(["--config", f"only={args.only}"] if args.only else [])]
            snakemake(root, *targets, env=KEY)
            cold = {"wall_s": round(time.perf_counter() - t0, 3), "teacher_calls": len(teacher.requests()),
                    "rag_calls": len(rag.requests())}
            print(json.dumps({"cold": cold}))
            warm = []
            for _ in range(args.repeats):
                before = (len(teacher.requests()), len(rag.requests()))
                t0 = time.perf_counter()
                snakemake(root, "--forceall", *targets, env=KEY)
                warm.append({"wall_s": round(time.perf_counter() - t0, 3),
                             "teacher_calls": len(teacher.requests()) - before[0],
                             "rag_calls": len(rag.requests()) - before[1]})
                print(json.dumps(warm[-1]))
        finally:
            teacher.stop()
            rag.stop()
    write_result("rerun_cost", {
        "what": f"data half (`snakemake data`, {args.only or 'both tenants'}), openai teacher + http RAG on loopback: cold run, "
                "then `snakemake --forceall data` with warm caches",
        "latency_s": args.latency, "rag_latency_s": args.rag_latency, "repeats": args.repeats,
        "cold": cold, "warm": warm,
        "warm_median": {"wall_s": median([w["wall_s"] for w in warm]),
                        "paid_calls": max(w["teacher_calls"] + w["rag_calls"] for w in warm)},
        "target": "paid_calls == 0"}, args)


if __name__ == "__main__":
    main()
