"""Cross-fitted preference pairs: each training row's rewrites sampled by an SFT student that did not train on it.

The pref_pairs stage samples the SFT student on the rows it was trained on, and it reproduces them: 88 to 94 % of
its samples put gold first, so few rows give a pair (studies/2026-12-07-preference,
studies/2026-12-07-preference-kto). Here the training rows are cut into `--folds` folds (seeded by query id); per
fold, an SFT student is trained with the product's own commands on the other folds' SFT targets (same config, same validation file for its checkpoint
choice), merged, and `qrewrite pref-pairs` samples and scores the held-out fold's rows with it. The folds' pairs
and KTO examples, concatenated, replace results/T/pref/{pairs,examples}.jsonl and summary.json (the in-sample
files are kept beside the fold work as in_sample_*); then the pipeline's own `pref` stage trains from the full SFT
model as always (snakemake with studies/2026-12-07-preference/pref_on.yaml, see README.md). Validation and test rows
are never read here. Each step is skipped where its output exists, so a killed run resumes.

    .venv/bin/python studies/2026-12-07-crossfit-pairs/crossfit.py --tenant chengla

Writes studies/2026-12-07-crossfit-pairs/crossfit_<tenant>.json: per fold the SFT's stats and the pairs summary,
and the combined counts beside the in-sample ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.common import machine  # noqa: E402
from qrewrite.io_utils import read_json, read_jsonl, write_json, write_jsonl  # noqa: E402

HERE = Path(__file__).resolve().parent


def fold_of(query_id: str, folds: int, seed: int) -> int:
    # a hash, not a shuffle: a row's fold does not move when other rows come or go
    return int(hashlib.sha256(f"{seed}:{query_id}".encode()).hexdigest(), 16) % folds


def run(argv: list[str], log: Path) -> None:
    print("+", " ".join(argv), flush=True)
    with open(log, "a") as f:
        rc = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"{argv[1]} failed ({rc}): see {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenant", required=True)
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    t, q = args.tenant, str(REPO / ".venv/bin/qrewrite")
    res = REPO / "results" / t
    work = res / "crossfit"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "crossfit.log"
    split_rows = list(read_jsonl(res / "sft/train.jsonl"))
    target_rows = list(read_jsonl(res / "sft/targets/train.jsonl"))
    base = ["--config", args.config, "--tenant", t]
    doc = {"study": "studies/2026-12-07-crossfit-pairs", "tenant": t, "folds": args.folds, "seed": args.seed,
           "machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join(["python", *sys.argv]), "per_fold": []}
    for f in range(args.folds):
        w = work / f"fold{f}"
        w.mkdir(exist_ok=True)
        held = [r for r in split_rows if fold_of(r["meta"]["query_id"], args.folds, args.seed) == f]
        trained = [r for r in target_rows if fold_of(r["meta"]["query_id"], args.folds, args.seed) != f]
        if not (w / "train_targets.jsonl").exists():
            write_jsonl(w / "train_targets.jsonl", trained)
            write_jsonl(w / "held_rows.jsonl", held)
        t0 = time.monotonic()
        if not (w / "sft.json").exists():
            run([q, "sft", *base, "--base", "models/base", "--train", str(w / "train_targets.jsonl"),
                 "--val", str(res / "sft/targets/val.jsonl"), "--out", str(w / "sft"), "--run-dir",
                 str(w / "sft-run"), "--tb", str(w / "tb"), "--stats", str(w / "sft.json")], log)
        if not (w / "sft-merged" / "config.json").exists():
            run([q, "merge-sft", *base, "--base", "models/base", "--adapter", str(w / "sft"),
                 "--out", str(w / "sft-merged")], log)
        if not (w / "summary.json").exists():
            run([q, "pref-pairs", *base, "--train", str(w / "held_rows.jsonl"), "--queries",
                 str(res / "queries.jsonl"), "--model", str(w / "sft-merged"), "--out", str(w / "pairs.jsonl"),
                 "--examples", str(w / "examples.jsonl"), "--summary", str(w / "summary.json")], log)
        sft = read_json(w / "sft.json")
        doc["per_fold"].append({"fold": f, "sft_rows": len(trained), "held_rows": len(held),
                                "sft": {k: sft.get(k) for k in ("wall_s", "steps", "best_checkpoint",
                                                                "best_eval_loss")},
                                "pairs_summary": read_json(w / "summary.json"),
                                "wall_s_this_call": round(time.monotonic() - t0, 1)})
    # the in-sample files, kept once: a second call must not copy the cross-fitted ones over them
    pref = res / "pref"
    for name in ("pairs.jsonl", "examples.jsonl", "summary.json"):
        if not (work / f"in_sample_{name}").exists() and (pref / name).exists():
            shutil.copy2(pref / name, work / f"in_sample_{name}")
    pairs = [p for f in range(args.folds) for p in read_jsonl(work / f"fold{f}" / "pairs.jsonl")]
    examples = [e for f in range(args.folds) for e in read_jsonl(work / f"fold{f}" / "examples.jsonl")]
    folds = [d["pairs_summary"] for d in doc["per_fold"]]
    summary = {**folds[0], "rows": sum(s["rows"] for s in folds),
               "rows_with_gold": sum(s["rows_with_gold"] for s in folds), "pairs": len(pairs),
               "kto_examples": {k: sum(s["kto_examples"][k] for s in folds) for k in ("desirable", "undesirable")},
               "no_pair": {k: sum(s["no_pair"][k] for s in folds) for k in folds[0]["no_pair"]},
               "chosen_source": {k: sum(s["chosen_source"].get(k, 0) for s in folds)
                                 for k in {k for s in folds for k in s["chosen_source"]}},
               "teacher_gold_first": sum(s["teacher_gold_first"] for s in folds),
               "samples": sum(s["samples"] for s in folds),
               "sample_gold_first_share": round(sum(s["sample_gold_first_share"] * s["samples"] for s in folds)
                                                / max(1, sum(s["samples"] for s in folds)), 4),
               "degenerate_samples": sum(s["degenerate_samples"] for s in folds),
               "sample_wall_s": round(sum(s["sample_wall_s"] for s in folds), 1),
               "wall_s": round(sum(s["wall_s"] for s in folds), 1),
               "crossfit": {"folds": args.folds, "seed": args.seed, "study": "studies/2026-12-07-crossfit-pairs"}}
    write_jsonl(pref / "pairs.jsonl", pairs)
    write_jsonl(pref / "examples.jsonl", examples)
    write_json(pref / "summary.json", summary)
    doc["combined"] = summary
    in_sample = work / "in_sample_summary.json"
    doc["in_sample"] = read_json(in_sample) if in_sample.exists() else None
    write_json(HERE / f"crossfit_{t}.json", doc)
    print(json.dumps({"pairs": len(pairs), "kto_examples": summary["kto_examples"], "no_pair": summary["no_pair"],
                      "in_sample_pairs": (doc["in_sample"] or {}).get("pairs")}))


if __name__ == "__main__":
    main()
