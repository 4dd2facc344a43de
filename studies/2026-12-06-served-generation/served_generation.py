"""What generating the release's rows as the gateway serves them (each row alone) costs and changes, on a finished
run: for each tenant whose release is a model, the eval's rows of the same student (generated in padded batches)
against the release's rows (one row at a time, `qrewrite.eval.candidates.served_decoding`): how many of the model's
own texts differ, and the two eval_generate jobs' wall times from Snakemake's benchmark files.

    .venv/bin/python bench/served_generation.py --tenant fivedoctors --tenant chengla

Writes bench/results/served_generation.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_result  # noqa: E402

STUDENT_CANDIDATE = {"sft_merged": "sft", "rl_model": "rl"}


def wall(path: Path) -> float | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as fh:
        return float(next(csv.DictReader(fh, delimiter="\t"))["s"])


def rows(path: Path) -> dict[str, dict]:
    return {r["query_id"]: r for r in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                                         if line.strip())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenant", action="append", required=True)
    args = ap.parse_args()
    out = {}
    for t in args.tenant:
        released = json.loads((REPO / f"models/{t}/release/release.json").read_text(encoding="utf-8"))["released"]
        if released["kind"] != "model":
            out[t] = {"release": released["name"], "kind": "rule", "note": "a rule: nothing is generated"}
            continue
        cand = STUDENT_CANDIDATE[released["artifact"]]
        batched, alone = rows(REPO / f"results/{t}/eval/{cand}.jsonl"), rows(REPO / f"results/{t}/eval/release.jsonl")
        own = lambda r: r.get("model_rewrite", r["rewrite"])  # noqa: E731
        differ = [q for q in alone if own(alone[q]) != own(batched[q])]
        gen = next(iter(alone.values()))["generation"]
        out[t] = {"release": released["name"], "student_candidate": cand, "rows": len(alone),
                  "model_texts_differ": len(differ), "examples": [{"query_id": q, "batched": own(batched[q]),
                                                                   "alone": own(alone[q])} for q in differ[:3]],
                  "batched_batch_size": next(iter(batched.values()))["generation"]["batch_size"],
                  "alone": {"batch_size": gen["batch_size"], "threads": gen["threads"], "dtype": gen["dtype"]},
                  "eval_generate_wall_s": {"batched": wall(REPO / f"benchmarks/{t}/{cand}/eval_generate.tsv"),
                                           "alone": wall(REPO / f"benchmarks/{t}/release/eval_generate.tsv")}}
        print(t, json.dumps(out[t], ensure_ascii=False)[:300])
    write_result("served_generation", {"tenants": out})


if __name__ == "__main__":
    main()
