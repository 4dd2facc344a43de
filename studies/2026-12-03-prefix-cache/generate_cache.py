"""A local model's greedy rewrites with and without the prompt-prefix cache (eval.generation.prefix_cache), in
one run on the same rows: wall time of each, their ratio, and how many rewrites differ (the target is none).

It generates a finished run's validation and test rows (results/T/sft/{val,test}.jsonl) with the project's
eval.generation settings, alternating the two modes `--repeats` times so a change of machine speed during the
run falls on both. Run it in the swift env (transformers):

    PYTHONPATH=. .venvs/swift/bin/python bench/generate_cache.py --project ../dd12 --tenant durdev \\
        --model models/durdev/sft-merged --threads 2
    PYTHONPATH=. .venvs/swift/bin/python bench/generate_cache.py --table

Writes bench/results/generate_cache_<tenant>.json.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import median, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.generate import generate_rewrites, generation_kwargs  # noqa: E402
from qrewrite.io_utils import read_json  # noqa: E402

RESULTS = REPO / "bench" / "results"
CONFIG = "results/.config.resolved.yaml"


def table() -> str:
    lines = ["| tenant | model | rows | threads | cached prefix (tokens) | uncached (s) | cached (s) | ratio | "
             "rewrites that differ |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("generate_cache_*.json")):
        d = read_json(path)
        lines.append(f"| {d['tenant']} | {d['model']} | {d['rows']} | {d['threads']} | {d['cached_prefix_tokens']} | "
                     f"{d['uncached_s']} | {d['cached_s']} | **{d['ratio']:.2f}** | {d['differing']} |")
    return "\n".join(lines)


def main() -> int:
    def add(ap):
        ap.add_argument("--model", help="a merged model folder, relative to --project")
        ap.add_argument("--threads", type=int, default=2)
        ap.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternated")

    args = study_args(__doc__, required=("tenant", "model"), add=add, table=table)
    if args is None:
        return 0
    os.chdir(args.project)  # the run's relative paths
    cfg = load_config(CONFIG)
    tenant = tenant_config(cfg, args.tenant)
    split = Path("results") / args.tenant / "sft"
    queries = str(Path("results") / args.tenant / "queries.jsonl")
    rows = [r for name in ("val", "test") for r in eval_rows(str(split / f"{name}.jsonl"), queries, None)]
    gen = cfg["eval"]["generation"]
    walls: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, list[str]] = {}
    prefix = 0
    for _ in range(args.repeats):
        for cached in (False, True):
            start = time.perf_counter()
            out, info = generate_rewrites(args.model, tenant, rows, **generation_kwargs(
                gen, threads=args.threads, device="cpu", latency_sample=0, prefix_cache=cached))
            walls[cached].append(round(time.perf_counter() - start, 2))
            outs[cached] = [r["raw_completion"] for r in out]
            prefix = max(prefix, info["cached_prefix_tokens"])
    differing = sum(a != b for a, b in zip(outs[False], outs[True]))
    data = {"tenant": args.tenant, "model": args.model, "rows": len(rows), "threads": args.threads,
            "batch_size": gen["batch_size"], "cached_prefix_tokens": prefix,
            "uncached_s": median(walls[False]), "cached_s": median(walls[True]),
            "ratio": round(median(walls[True]) / median(walls[False]), 3), "walls_s": {"uncached": walls[False],
                                                                                      "cached": walls[True]},
            "differing": differing, "note": "wall time includes each mode's model load and warm-up"}
    print(write_result(f"generate_cache_{args.tenant}", data))
    print(table())
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
