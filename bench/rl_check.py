"""The RL check: does GRPO on 2 CPU cores move a student beyond its SFT parent? (`make rl-check`; not in `make run`.)

Runs the pipeline for one tenant in a work folder with config.yaml + bench/rl_check.yaml (the faithful reward,
the GRPO settings, a 30 % test split) and writes bench/results/rl_check_<tenant>.json: the SFT run, the reward
curve per GRPO step with its trend, the rl stage's own RL-vs-SFT verdict on the validation prompts, and the eval's
tie-aware Hit@1 of raw / query + history / teacher / SFT / RL on the test split and the gold set with the paired
RL − SFT interval; and bench/results/rl_check_<tenant>.svg, the reward curve with its rolling mean (`--name`
chooses another name than rl_check_<tenant>).

    .venv/bin/python -m bench.rl_check --tenant fivedoctors --sft-epochs 0.5      # a deliberately short SFT
    .venv/bin/python -m bench.rl_check --tenant cqr --sft-epochs 0.5 --name rl_check_cqr_short_sft
    .venv/bin/python -m bench.rl_check --tenant cqr                               # data/cqr (make cqr-data)
    .venv/bin/python -m bench.rl_check --tenant fivedoctors --grpo-steps 80 --set rl.swift_grpo.learning_rate=1e-4

The work folder (default bench/work/rl_check-<tenant>, or bench/work/<name>) is kept: rerunning with other GRPO
settings retrains RL only (Snakemake sees the SFT model up to date).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from bench.common import BIN, REPO, bench_args, write_result

from qrewrite.io_utils import read_json, read_jsonl, write_text_atomic
from qrewrite.paths import eval_paths, tenant_paths
from qrewrite.report import svg
from qrewrite.reward.monitor import CURVE_FILE
from qrewrite.training.rl.summary import reward_trend

SETTINGS = REPO / "bench" / "rl_check.yaml"
ROLLING = 5


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def setting(path: str, value: str) -> dict:
    """--set a.b.c=value as a nested mapping (the value parsed as YAML)."""
    keys = path.split(".")
    node: dict = {keys[-1]: yaml.safe_load(value)}
    for k in reversed(keys[:-1]):
        node = {k: node}
    return node


def project(work: Path, tenant: str, overrides: list[dict]) -> dict:
    """The work folder's config.yaml (written) and its tenant entry; the tenant's files linked in."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    if tenant == "cqr":
        cqr = REPO / "data" / "cqr" / "config.yaml"
        if not cqr.exists():
            raise SystemExit(f"{cqr} not found: build the CQR tenant first (make cqr-data)")
        cfg = deep_merge(cfg, yaml.safe_load(cqr.read_text(encoding="utf-8")))
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == tenant]
    if not cfg["tenants"]:
        raise SystemExit(f"no tenant {tenant!r} in config.yaml (or data/cqr for cqr)")
    cfg = deep_merge(cfg, yaml.safe_load(SETTINGS.read_text(encoding="utf-8")))
    for o in overrides:
        cfg = deep_merge(cfg, o)
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("kb", "demo", "cqr"):  # the tenants' data, where config.yaml says (relative paths); a copy, so
        if (REPO / "data" / sub).is_dir():  # the work folder's generated files never touch the checkout's
            shutil.copytree(REPO / "data" / sub, work / "data" / sub, dirs_exist_ok=True)
    write_text_atomic(work / "config.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
    return cfg


def run(work: Path, tenant: str, log: Path) -> float:
    p, e = tenant_paths(tenant), eval_paths(tenant)
    targets = [e["eval_json"], p["stats_rl"], p["stats_sft"]]
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
           str(work / "config.yaml"), "--cores", "2", "--rerun-incomplete", *targets]  # the config holds this one tenant;
    # an interrupted rl job reruns, and the stage resumes from its last checkpoint
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    if proc.returncode:
        raise SystemExit(f"snakemake failed ({proc.returncode}); see {log}")
    return round(time.perf_counter() - t0, 1)


def rolling(values: list[float], k: int) -> list[tuple[int, float]]:
    return [(i + 1, sum(values[i + 1 - k:i + 1]) / k) for i in range(len(values)) if i + 1 >= k]


def trainer_curve(run_dir: Path) -> list[dict]:
    """ms-swift's own per-step log (logging.jsonl in the run folder): the reward per GRPO step from step 1 even
    when the run was resumed (a resumed step logs again: the last line of a step wins)."""
    path = run_dir / "logging.jsonl"
    steps: dict[int, dict] = {}
    for row in read_jsonl(path) if path.is_file() else []:
        if "reward" in row and "global_step/max_steps" in row:
            step = int(str(row["global_step/max_steps"]).split("/")[0])
            steps[step] = {"reward_mean": float(row["reward"]), "reward_std": float(row.get("reward_std", "nan")),
                           "clipped_ratio": float(row.get("completions/clipped_ratio", "nan"))}
    return [steps[k] for k in sorted(steps)]


def collect(work: Path, tenant: str, cfg: dict, wall_s: float) -> dict:
    p, e = tenant_paths(tenant), eval_paths(tenant)
    sft, rl = read_json(work / p["stats_sft"]), read_json(work / p["stats_rl"])
    curve = trainer_curve(work / p["rl_run"]) or read_jsonl(work / p["tb_rl"] / CURVE_FILE)
    trend = reward_trend([r["reward_mean"] for r in curve])
    doc = read_json(work / e["eval_json"])
    cands = doc["candidates"]

    def hit(name, section=None):
        c = (section or cands).get(name)
        return None if c is None else {k: c["hit_at_1"][k] for k in ("mean", "ci_low", "ci_high", "n")}

    gold = (doc.get("gold_set") or {}).get("candidates") or {}
    return {
        "tenant": tenant, "wall_s": wall_s,
        "settings": {"reward": cfg["reward"], "swift_grpo": cfg["rl"]["swift_grpo"], "split": cfg["split"],
                     "sft": cfg["train"]["sft"]},
        "sft": {k: sft.get(k) for k in ("wall_s", "steps", "schedule", "stopped", "best_eval_loss")},
        "rl": {"wall_s": rl["wall_s"], "resumed_from": rl.get("resumed_from"), "reward_steps": len(curve),
               "trend": trend,
               "first": rl["reward"]["first"], "last": rl["reward"]["last"], "vs_sft_on_val": rl.get("vs_sft")},
        "reward_curve": [{"step": i + 1, **{k: r.get(k) for k in ("reward_mean", "reward_std", "clipped_ratio")}}
                         for i, r in enumerate(curve)],
        "test": {"n": doc["n_queries"], "hit_at_1": {n: hit(n) for n in cands},
                 "rl_vs_sft": doc["comparisons"].get("rl_vs_sft", {}).get("hit_at_1"),
                 "sft_vs_query_history": doc["comparisons"].get("sft_vs_query_history", {}).get("hit_at_1")},
        "gold_set": {"n": (doc.get("gold_set") or {}).get("n"), "hit_at_1": {n: hit(n, gold) for n in gold}},
    }


def chart(result: dict) -> str:
    values = [r["reward_mean"] for r in result["reward_curve"]]
    series = [{"name": "reward_mean per GRPO step", "points": list(enumerate(values, 1)), "color": "#9ab"},
              {"name": f"rolling mean of {ROLLING}", "points": rolling(values, ROLLING), "color": "#c33"}]
    t = result["rl"]["trend"]
    verdict = ("rose beyond its noise" if t.get("rose_beyond_noise") else "not beyond its noise")
    return svg.lines(f"{result['tenant']}: GRPO reward ({len(values)} steps, {verdict})", series, y_label="reward")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tenant", required=True, help="fivedoctors, chengla or cqr")
    ap.add_argument("--work", type=Path, help="work folder (default bench/work/rl_check-<tenant>)")
    ap.add_argument("--sft-epochs", type=float, help="train.sft.num_train_epochs (a short SFT leaves RL room)")
    ap.add_argument("--grpo-steps", type=int, help="rl.swift_grpo.max_steps")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any config key, e.g. rl.swift_grpo.learning_rate=1e-4 (repeatable)")
    ap.add_argument("--name", help="result name under bench/results (default rl_check_<tenant>): keep one run's "
                                   "figures beside another's")
    ap.add_argument("--fresh", action="store_true", help="delete the work folder first")
    args = bench_args(ap, quick=None)  # no quick mode: it trains SFT and GRPO (tens of minutes)
    name = args.name or f"rl_check_{args.tenant}"
    work = args.work or REPO / "bench" / "work" / (args.name or f"rl_check-{args.tenant}")
    if args.fresh and work.exists():
        shutil.rmtree(work)
    overrides = [setting(*kv.split("=", 1)) for kv in args.set]
    if args.sft_epochs:
        overrides.append({"train": {"sft": {"num_train_epochs": args.sft_epochs}}})
    if args.grpo_steps:
        overrides.append({"rl": {"swift_grpo": {"max_steps": args.grpo_steps}}})
    cfg = project(work, args.tenant, overrides)
    wall = run(work, args.tenant, work / "snakemake.log")
    result = collect(work, args.tenant, cfg, wall)
    write_result(name, result, args)
    write_text_atomic(args.results / f"{name}.svg", chart(result))
    print(json.dumps({k: result[k] for k in ("sft", "rl", "test", "gold_set")}, indent=1))


if __name__ == "__main__":
    main()
