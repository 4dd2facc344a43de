"""Bench 5: reward throughput: rewards per second for 256 rollouts, with local and with HTTP RAG,
the OpenAI judge sampled at 30 % against the test server (injected latency --judge-latency).

32 fivedoctors queries x 8 distinct rollouts, the teacher side precomputed (as the RL data carries
it). Each repeat: a fresh scorer and fresh caches (cold), then the same batch again (warm: every
retrieval and verdict from cache). HTTP RAG = the real RAG app on loopback (no injected latency).
Medians over --repeats.

    .venv/bin/python -m bench.reward_throughput [--rollouts 256] [--judge-latency 0.2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.common import (bench_args, config_for, fake_openai, fault_rag, median, scratch_project, synthetic_queries,
                          update_config, write_result)

KEY = {"QR_BENCH_KEY": "sk-bench-not-a-real-key"}
SUFFIXES = ["", " 用法用量", " 适用人群", " 禁忌", " 储存方法", " 孕妇能吃吗", " 饭前还是饭后", " 副作用"]


def samples(cfg: dict, tenant: dict, n: int):
    from qrewrite.kb import load_kb
    from qrewrite.metrics import mean_top3, top1
    from qrewrite.rag.local import LocalRetriever
    from qrewrite.reward.scorer import RewardSample

    retriever = LocalRetriever(load_kb(tenant["kb"]["path"]), tenant["language"])
    per_query = len(SUFFIXES)
    out = []
    for q in synthetic_queries(n // per_query):
        teacher = f"{q['query']} 五医生"
        hits = retriever.search(teacher, cfg["rag"]["top_k"])
        for s in SUFFIXES:
            out.append(RewardSample(query_id=q["id"], query=q["query"], rollout=f"{q['query']}{s}",
                                    teacher_rewrite=teacher, teacher_top1=top1(hits), teacher_mean_top3=mean_top3(hits),
                                    gold_doc_ids=q["gold_doc_ids"], profile=q["profile"], history=q["history"]))
    return out


def one_pass(cfg: dict, tenant: dict, batch, cache_dir: Path) -> dict:
    from qrewrite.reward.scorer import RewardScorer

    cfg["reward"]["cache_dir"] = str(cache_dir)
    scorer = RewardScorer(cfg, tenant)
    try:
        t0 = time.perf_counter()
        rewards = scorer.score_batch(batch)
        cold = time.perf_counter() - t0
        cold_stats = scorer.stats()
        t0 = time.perf_counter()
        scorer.score_batch(batch)
        warm = time.perf_counter() - t0
    finally:
        scorer.close()
    assert len(rewards) == len(batch)
    return {"cold_s": cold, "warm_s": warm, "stats": cold_stats}


# --quick: a smoke run in seconds (tests/test_bench_quick.py)
QUICK = {"rollouts": 64, "judge_latency": 0.05, "repeats": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--judge-latency", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    args = bench_args(ap, quick=QUICK)
    os.environ.update(KEY)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = scratch_project(tmp / "proj")
        judge, rag = fake_openai(tmp), fault_rag(root, tmp)
        try:
            judge.script(latency_s=args.judge_latency, replies={"<data>": '{"score": 4, "reason": "ok"}'})
            update_config(root, reward={"judge": {"provider": "openai", "sample_share": 0.3, "openai": {
                "base_url": judge.url, "model": "bench-judge", "api_key_env": "QR_BENCH_KEY", "backoff_base_s": 0.0}}})
            run = 0
            for provider in ("local", "http"):
                update_config(root, rag={"provider": provider, "http": {"base_url": rag.url}})
                cfg, tenant = config_for(root)
                batch = samples(cfg, tenant, args.rollouts)
                passes = []
                for _ in range(args.repeats):
                    run += 1
                    passes.append(one_pass(cfg, tenant, batch, tmp / f"reward{run}"))
                cold, warm = median([p["cold_s"] for p in passes]), median([p["warm_s"] for p in passes])
                st = passes[0]["stats"]
                judge_calls = st["judge_calls"]
                conc = cfg["reward"]["judge"]["openai"]["concurrency"]
                out[provider] = {
                    "rollouts": len(batch), "cold_s": cold, "cold_walls_s": [round(p["cold_s"], 3) for p in passes],
                    "rewards_per_s_cold": round(len(batch) / cold, 1), "warm_s": warm,
                    "rewards_per_s_warm": round(len(batch) / warm, 1),
                    "judge_sampled": st["judge_sampled"], "judge_calls": judge_calls, "rag_calls": st["rag_calls"],
                    "judge_bound_s": round(judge_calls * args.judge_latency / conc, 3),
                    "judge_concurrency": conc}
                out[provider]["ratio_to_judge_bound"] = round(out[provider]["judge_bound_s"] / cold, 3)
                print(json.dumps({provider: out[provider]}))
        finally:
            judge.stop()
            rag.stop()
    write_result("reward_throughput", {
        "what": f"RewardScorer.score_batch on {args.rollouts} rollouts ({args.rollouts // len(SUFFIXES)} queries x "
                f"{len(SUFFIXES)}), OpenAI judge at 30 % against the test server; cold = fresh caches, warm = same "
                "batch again",
        "judge_latency_s": args.judge_latency, "repeats": args.repeats, **out}, args)


if __name__ == "__main__":
    main()
