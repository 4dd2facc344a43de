"""How many training rows SFT needs before the student reaches query + history: the measurement behind the training
gate's floor (gate.min_train_rows). On a finished run's tenant, SFT is trained on the first N of its training rows
for each N, with the run's own settings (config, base model, SFT targets), merged, and the plain greedy student
rewrites the validation rows with gold; its tie-aware Hit@1 through the tenant's RAG is set beside query + history's
on the same rows. Validation only (the floor is a setting): test rows are not read.

    PYTHONPATH=. .venvs/swift/bin/python bench/train_floor.py --tenant fivedoctors --rows 10 20 40 80 --threads 2

Writes bench/results/train_floor_<tenant>.json (per N: the rows, SFT's wall seconds, steps, best loss, validation
Hit@1 with its interval and the paired difference to query + history). Scratch folders under --work.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import RULE_REWRITES, eval_rows, model_rewrites  # noqa: E402
from qrewrite.eval.hits import hit_at_1  # noqa: E402
from qrewrite.io_utils import read_jsonl, write_jsonl  # noqa: E402
from qrewrite.paths import BASE_MODEL, artifact_paths  # noqa: E402

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenant", required=True)
    ap.add_argument("--rows", type=int, nargs="+", required=True, help="training rows per arm (the first N)")
    ap.add_argument("--project", default=str(REPO), help="the finished run (default this checkout)")
    ap.add_argument("--work", default="/tmp/qrw-train-floor", help="scratch folder (adapters, merged models)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default="config.yaml", help="the run's config (default config.yaml)")
    args = ap.parse_args()
    os.chdir(args.project)
    from qrewrite.training.swift.merge import merge_lora
    from qrewrite.training.sft.train import run_sft

    cfg = load_config(args.config)
    tenant = tenant_config(cfg, args.tenant)
    paths = artifact_paths(tenant)
    train = read_jsonl(paths["sft_train"])
    rows = [r for r in eval_rows(paths["val"], paths["queries"], None) if r["gold_doc_ids"]]
    spec = {"name": "rule", "kind": "query_history"}
    qh = {r["query_id"]: r["rewrite"] for r in RULE_REWRITES["query_history"](spec, rows)}
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    work = Path(args.work) / args.tenant
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    arms = []
    base_scores = hit_at_1(cfg, tenant, rows, {"query_history": qh})["query_history"]
    for n in sorted(set(args.rows)):
        if n > len(train):
            print(f"{n} rows: the tenant has {len(train)} training rows; skipped", file=sys.stderr)
            continue
        arm = work / f"n{n}"
        arm.mkdir()
        write_jsonl(arm / "train.jsonl", train[:n])
        t0 = time.perf_counter()
        st = run_sft(cfg, base=BASE_MODEL, train=str(arm / "train.jsonl"), val=paths["sft_val"], out=str(arm / "sft"),
                     run_dir=str(arm / "run"), tb_dir=str(arm / "tb"), log_file=str(arm / "sft.log"),
                     threads=args.threads)
        sft_s = time.perf_counter() - t0
        merge_lora(cfg, base=BASE_MODEL, adapter=str(arm / "sft"), out=str(arm / "merged"),
                   log_file=str(arm / "merge.log"), threads=args.threads)
        out, _ = model_rewrites({"name": "sft", "kind": "model", "generation": {"latency_sample": 0}}, cfg, tenant,
                                rows, str(arm / "merged"), args.threads)
        scores = hit_at_1(cfg, tenant, rows, {"sft": {r["query_id"]: r["rewrite"] for r in out}})["sft"]
        arms.append({"train_rows": n, "sft_wall_s": round(sft_s, 1), "steps": st["steps"],
                     "best_eval_loss": st["best_eval_loss"], "val_hit_at_1": stats.mean_ci(scores, **bkw),
                     "minus_query_history": stats.paired(scores, base_scores, **bkw)})
        print(arms[-1], flush=True)
        shutil.rmtree(arm / "merged", ignore_errors=True)  # a merged model is ~1 GB
    write_result(f"train_floor_{args.tenant}", {
        "tenant": args.tenant, "project": args.project, "n_train_available": len(train),
        "n_val_with_gold": len(rows), "val_query_history": stats.mean_ci(base_scores, **bkw),
        "threads": args.threads, "arms": arms,
        "basis": "validation rows with gold; plain greedy student (eval.generation); SFT with the run's settings "
                 "on the first N training rows (the run's sft_targets)"})


if __name__ == "__main__":
    main()
