"""The students' decoding dtype, chosen on validation: for a project the pipeline has run, each student (SFT, RL)
rewrites the validation rows with the weights in float32 and in bfloat16 (`eval.generation.dtype`), greedy, the
eval's decoding otherwise; each generation's wall time (model load included, the two dtypes alternating so both
see the same machine), the rewrites that differ, and tie-aware Hit@1 with the release's scorer, paired
(bfloat16 − float32). `--test` scores the test rows too: for the record after the choice, never to make it.

    PYTHONPATH=. .venvs/swift/bin/python bench/dtype_lever.py --project . --tenant fivedoctors --threads 1
    PYTHONPATH=. .venvs/swift/bin/python bench/dtype_lever.py --table

Writes bench/results/dtype_lever_<tenant>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import mean_text, paired_text, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.generate import generate_rewrites, generation_kwargs  # noqa: E402
from qrewrite.eval.hits import hit_at_1  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402

RESULTS = REPO / "bench" / "results"
DTYPES = ("float32", "bfloat16")
MODELS = {"sft": "sft_merged", "rl": "rl_model"}


def split(cfg: dict, tenant: dict, rows: list[dict], models: dict, threads: int | None) -> dict:
    gen = cfg["eval"]["generation"]
    bkw = dict(samples=cfg["eval"]["bootstrap"]["samples"], seed=cfg["eval"]["bootstrap"]["seed"],
               confidence=cfg["eval"]["bootstrap"]["confidence"])
    out = {}
    for name, model_dir in models.items():
        texts, wall = {}, {}
        # the second model starts with the other dtype, so neither always runs first (a warm page cache, a busier
        # minute)
        order = DTYPES if name == "sft" else DTYPES[::-1]
        for dtype in order:
            start = time.monotonic()
            res, _ = generate_rewrites(model_dir, tenant, rows, **generation_kwargs(
                gen, threads=threads, device="cpu", latency_sample=0, dtype=dtype))
            wall[dtype] = round(time.monotonic() - start, 1)
            texts[f"{name}/{dtype}"] = {r["query_id"]: r["rewrite"] for r in res}
        per_row = hit_at_1(cfg, tenant, rows, texts)
        a, b = (texts[f"{name}/{d}"] for d in DTYPES)
        out[name] = {"model_dir": model_dir, "wall_s": wall,
                     "speedup": round(wall["float32"] / wall["bfloat16"], 2),
                     "rewrites_differ": sum(a[q] != b[q] for q in a),
                     "examples": [[a[q], b[q]] for q in a if a[q] != b[q]][:5],
                     **{d: stats.mean_ci(per_row[f"{name}/{d}"], **bkw) for d in DTYPES},
                     "bf16_minus_fp32": stats.paired(per_row[f"{name}/bfloat16"], per_row[f"{name}/float32"], **bkw)}
    return out


def measure(project: Path, tenant_name: str, config: str, threads: int | None, test: bool) -> dict:
    os.chdir(project)  # the project's relative paths (results/, models/, the KB)
    cfg = load_config(config)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    models = {n: paths[k] for n, k in MODELS.items()}
    doc = {"tenant": tenant_name, "project": str(project), "threads": threads}
    for part in ("val", "test") if test else ("val",):
        rows = [r for r in eval_rows(paths[part], paths["queries"], None) if r["gold_doc_ids"]]
        doc[part] = {"n": len(rows), **split(cfg, tenant, rows, models, threads)}
    return doc


def table() -> str:
    lines = ["| tenant | student | validation float32 | validation bfloat16 | bf16 − fp32 (validation) | rewrites that "
             "differ | generation time fp32 / bf16 | test fp32 / bf16 (after) |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("dtype_lever_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for name, v in doc["val"].items():
            if not isinstance(v, dict):
                continue
            t = doc.get("test", {}).get(name)
            after = f"{mean_text(t['float32'])} / {mean_text(t['bfloat16'])}" if t else "–"
            lines.append(f"| {doc['tenant']} ({doc['val']['n']} val) | {name} | {mean_text(v['float32'])} | "
                         f"{mean_text(v['bfloat16'])} | {paired_text(v['bf16_minus_fp32'])} | {v['rewrites_differ']} | "
                         f"{v['wall_s']['float32']} / {v['wall_s']['bfloat16']} s ({v['speedup']}x) | {after} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--config", default="results/.config.resolved.yaml",
                        help="the config the run used (relative to --project)")
        ap.add_argument("--threads", type=int)
        ap.add_argument("--test", action="store_true", help="also score the test rows (after the choice)")

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"dtype_lever_{args.tenant}", measure(args.project.resolve(), args.tenant, args.config,
                                                           args.threads, args.test))
        print(table())


if __name__ == "__main__":
    main()
