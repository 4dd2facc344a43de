"""SFT's arithmetic on this machine (`train.sft.precision`): a few `swift sft` steps of one tenant of a project the
data half has run, in float32 and under bf16 autocast, alternating (float32, bf16, float32, bf16 with --repeats 2),
same data, settings and thread count; per-step seconds from each run's logging.jsonl (the first step, which holds
the warm-up, left out), the one evaluation's seconds, the losses. Ratios are within one run, so the hour's speed
cancels. bf16 weights (`--torch_dtype bfloat16`, ran slower here twice) is `--with-bf16-weights`.

    PYTHONPATH=. .venvs/swift/bin/python bench/sft_precision.py --project . --tenant fivedoctors --threads 1
    PYTHONPATH=. .venvs/swift/bin/python bench/sft_precision.py --table

Needs the project's models/base and results/T/sft/targets/{train,val}.jsonl (`snakemake --cores 2 --until sft
--omit-from sft`). Writes bench/results/sft_precision_<tenant>.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite.hardware import cpu_has_bf16  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402
from qrewrite.training.sft import train as S  # noqa: E402
from qrewrite.training.swift import commands, runner  # noqa: E402

RESULTS = REPO / "bench" / "results"
CONFIG = "results/.config.resolved.yaml"


def one_run(cfg: dict, paths: dict, precision: str, steps: int, threads: int, work: Path) -> dict:
    hp = {**S.sft_hparams(cfg), "precision": precision}
    run_dir = work / f"run-{precision}-{time.monotonic_ns()}"
    base = str(Path(paths["base_model"]).resolve())
    cmd = S.swift_sft_args(hp, base=base, train=str(Path(paths["sft_train"]).resolve()),
                           val=str(Path(paths["sft_val"]).resolve()), run_dir=str(run_dir), tb_dir=str(run_dir / "tb"),
                           steps=steps, eval_steps=steps, early_stop=None)
    argv = commands.sft_cmd({**cmd, "logging_steps": 1})
    if precision == "bf16_weights":  # not a pipeline setting: the weights themselves in bf16
        i = argv.index("--torch_dtype")
        argv[i + 1] = "bfloat16"
        argv += ["--bf16", "true", "--use_cpu", "true"]
    t0 = time.monotonic()
    runner.run_swift(argv, log_file=str(work / f"{run_dir.name}.log"), env={"OMP_NUM_THREADS": str(threads)})
    wall = time.monotonic() - t0
    recs = [json.loads(line) for line in (run_dir / "logging.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if "loss" in r and "eval_loss" not in r]
    ev = [r for r in recs if "eval_loss" in r]
    elapsed = [_seconds(r["elapsed_time"]) for r in train]
    per_step = [b - a for a, b in zip(elapsed, elapsed[1:])]  # from step 2: the first holds the warm-up
    out = {"precision": precision, "wall_s": round(wall, 1), "steps": len(train),
           "s_per_step": round(statistics.mean(per_step), 2) if per_step else None,
           "losses": [float(r["loss"]) for r in train], "eval_loss": float(ev[-1]["eval_loss"]) if ev else None,
           "eval_s": round(float(ev[-1]["eval_runtime"]), 1) if ev and "eval_runtime" in ev[-1] else None}
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _seconds(text: str) -> float:
    """ms-swift's elapsed_time ('1m 3s', '54s', '1h 2m 3s') in seconds."""
    total = 0.0
    for part in str(text).split():
        unit = part[-1]
        total += float(part[:-1]) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def measure(project: Path, tenant_name: str, steps: int, threads: int, repeats: int, bf16_weights: bool) -> dict:
    os.chdir(project)
    cfg = load_config(CONFIG)
    paths = artifact_paths(tenant_config(cfg, tenant_name))
    arms = ["float32", "bfloat16"] + (["bf16_weights"] if bf16_weights else [])
    runs = []
    with tempfile.TemporaryDirectory(prefix="sft-precision-") as tmp:
        for _ in range(repeats):
            for arm in arms:
                runs.append(one_run(cfg, paths, arm, steps, threads, Path(tmp)))
                print(json.dumps(runs[-1]), flush=True)
    by = {a: [r for r in runs if r["precision"] == a] for a in arms}
    med = {a: {k: statistics.median([r[k] for r in rs if r[k] is not None])
               for k in ("s_per_step", "eval_s", "wall_s") if any(r[k] is not None for r in rs)} for a, rs in by.items()}
    ratio = {a: {k: round(med["float32"][k] / med[a][k], 2) for k in med[a] if med[a].get(k)}
             for a in arms if a != "float32"}
    return {"tenant": tenant_name, "project": str(project), "steps": steps, "threads": threads, "repeats": repeats,
            "cpu_has_bf16": cpu_has_bf16(), "runs": runs, "median": med, "speedup_vs_float32": ratio}


def table() -> str:
    lines = ["| tenant | threads | bf16 units | float32 s/step | bf16 autocast s/step | speed-up (step / eval / wall) |",
             "|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("sft_precision_*.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        m, r = d["median"], d["speedup_vs_float32"]["bfloat16"]
        lines.append(f"| {d['tenant']} | {d['threads']} | {d['cpu_has_bf16']} | {m['float32']['s_per_step']} | "
                     f"{m['bfloat16']['s_per_step']} | {r.get('s_per_step')}x / {r.get('eval_s')}x / {r.get('wall_s')}x |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--steps", type=int, default=8)
        ap.add_argument("--threads", type=int, default=1)
        ap.add_argument("--repeats", type=int, default=2)
        ap.add_argument("--with-bf16-weights", action="store_true")

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"sft_precision_{args.tenant}",
                     measure(args.project.resolve(), args.tenant, args.steps, args.threads, args.repeats,
                             args.with_bf16_weights))
        print(table())


if __name__ == "__main__":
    main()
