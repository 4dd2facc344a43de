"""What a bigger GRPO budget buys a student that trails query + history ("RL sized by need"), on the
tenant's own split and SFT model: the pipeline's rl stage rerun with bench/rl_budget.yaml over the run's config
(the RL check's run-A settings, docs/training.md, with `max_steps` set), then the release (chosen on validation)
and the eval (test). This script only collects: it reads a run's files and appends one entry per budget.

    # in a project where the tenant's pipeline has run (here dur-dev, `make durdev`):
    snakemake --cores 2 --configfile data/durdev/config.yaml bench/rl_budget.yaml --rerun-triggers mtime
    PYTHONPATH=. .venv/bin/python bench/rl_budget.py --project . --tenant durdev --label "24 steps"

Writes bench/results/rl_budget_<tenant>.json (an entry per --label, replaced when run again); `--table` prints
every result. The entry for the shipped 2 steps comes from the files of the run before the rerun
(`--eval/--release/--rl-stats` point at copies kept aside).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, paired_text, study_args, write_result  # noqa: E402

from qrewrite.io_utils import read_json  # noqa: E402


def entry(label: str, eval_json: Path, release_json: Path, rl_stats: Path) -> dict:
    ev, rel, rl = read_json(eval_json), read_json(release_json), read_json(rl_stats)
    fig = lambda c: {k: c[k] for k in ("mean", "ci_low", "ci_high", "n")}  # noqa: E731
    val = {c["name"]: fig(c) for c in rel["candidates"]}
    test = {n: fig(c["hit_at_1"]) for n, c in ev["candidates"].items()}
    pick = ("diff", "ci_low", "ci_high", "n", "a_better", "b_better")
    comps = {k: {x: v["hit_at_1"][x] for x in pick} for k, v in ev["comparisons"].items()
             if k in ("rl_vs_sft", "rl_vs_query_history", "sft_vs_query_history", "release_vs_query_history")}
    r = rl["reward"]
    return {"label": label, "grpo": {k: rl["hparams"].get(k) for k in (
                "max_steps", "num_generations", "per_device_train_batch_size", "max_completion_length",
                "temperature", "beta", "dynamic_sample", "learning_rate")},
            "rl_wall_s": rl["wall_s"], "reward_first": r["first"]["reward_mean"], "reward_last": r["last"]["reward_mean"],
            "reward_trend": r.get("trend"), "released": rel["released"]["name"], "validation": val, "test": test,
            "test_comparisons": comps}


def table() -> str:
    lines = ["| tenant | GRPO budget | RL wall | val SFT / RL / q+h | released | test SFT / RL | test RL − SFT |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("rl_budget_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for e in doc["entries"]:
            v, t, d = e["validation"], e["test"], e["test_comparisons"]["rl_vs_sft"]
            lines.append(f"| {doc['tenant']} | {e['label']} | {e['rl_wall_s']:.0f} s | {v['sft']['mean']:.3f} / "
                         f"{v['rl']['mean']:.3f} / {v['query_history']['mean']:.3f} | {e['released']} | "
                         f"{t['sft']['mean']:.3f} / {t['rl']['mean']:.3f} | {paired_text(d)} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--label", help="what this budget is, e.g. '24 steps'")
        ap.add_argument("--eval", type=Path, help="eval.json (default: the project's reports/T/eval.json)")
        ap.add_argument("--release", type=Path, help="release.json (default: models/T/release/release.json)")
        ap.add_argument("--rl-stats", type=Path, help="the rl stage's stats (default: results/T/stats/rl.json)")

    args = study_args(__doc__, required=("tenant", "label"), add=add, table=table)
    if not args:
        return
    p, t = args.project.resolve(), args.tenant
    new = entry(args.label, args.eval or p / "reports" / t / "eval.json",
                args.release or p / "models" / t / "release" / "release.json",
                args.rl_stats or p / "results" / t / "stats" / "rl.json")
    path = RESULTS / f"rl_budget_{t}.json"
    old = json.loads(path.read_text(encoding="utf-8"))["entries"] if path.is_file() else []
    write_result(f"rl_budget_{t}", {"tenant": t, "project": str(p),
                                    "entries": [e for e in old if e["label"] != args.label] + [new]})
    print(table())


if __name__ == "__main__":
    main()
