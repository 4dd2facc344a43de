"""The release's levers, chosen on validation and reported on test: for a project the pipeline has run, every
release candidate (query + history; SFT and RL, each with every `release.decoding` lever) beside its validation
Hit@1 (models/T/release/release.json, what the choice saw) and its test Hit@1 (measured here, after the choice,
with the same scoring code), the released one marked.

It only reports: nothing here feeds back into a setting. Run it in the swift env (the students generate):

    PYTHONPATH=. .venvs/swift/bin/python bench/release_levers.py --project . --tenant fivedoctors
    PYTHONPATH=. .venvs/swift/bin/python bench/release_levers.py --table     # docs/training.md's lever table

Writes bench/results/release_levers_<tenant>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import mean_text, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.io_utils import read_json  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402
from qrewrite.release.folder import RELEASE_FILE  # noqa: E402
from qrewrite.release.score import release_candidates, score  # noqa: E402

RESULTS = REPO / "bench" / "results"


def measure(project: Path, tenant_name: str, config: str, threads: int | None) -> dict:
    os.chdir(project)  # the project's relative paths (results/, models/, the KB)
    cfg = load_config(config)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    release = read_json(Path(paths["release"]) / RELEASE_FILE)
    cands = release_candidates(cfg)
    if [c["name"] for c in cands] != [c["name"] for c in release["candidates"]]:
        raise SystemExit(f"{paths['release']} was chosen among other candidates than {config} names: rerun the "
                         "release stage first")
    rows = [r for r in eval_rows(paths["test"], paths["queries"], None) if r["gold_doc_ids"]]
    start = time.monotonic()
    figures, per_row = score(cfg, tenant, rows, cands, {"sft_merged": paths["sft_merged"],
                                                        "rl_model": paths["rl_model"]}, threads)
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    base = cands[0]["name"]
    table = []
    for val, test in zip(release["candidates"], figures):
        table.append({"name": test["name"], "released": test["name"] == release["released"]["name"],
                      "val": {k: val[k] for k in ("mean", "ci_low", "ci_high", "n")},
                      "test": {k: test[k] for k in ("mean", "ci_low", "ci_high", "n")},
                      f"test_minus_{base}": (stats.paired(per_row[test["name"]], per_row[base], **bkw)
                                             if test["name"] != base else None)})
    return {"tenant": tenant_name, "project": str(project),
            "released": release["released"]["name"], "why": release["decision"]["why"],
            "n_val_with_gold": release["n_with_gold"], "n_test_with_gold": len(rows),
            "test_wall_s": round(time.monotonic() - start, 1), "candidates": table}


def table() -> str:
    lines = ["| tenant | candidate | validation Hit@1 (chose) | test Hit@1 (reported) | test − first |",
             "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("release_levers_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for c in doc["candidates"]:
            d = next((v for k, v in c.items() if k.startswith("test_minus_")), None)
            diff = f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d else "–"
            name = f"**{c['name']}** (released)" if c["released"] else c["name"]
            lines.append(f"| {doc['tenant']} ({doc['n_val_with_gold']} val / {doc['n_test_with_gold']} test) | "
                         f"{name} | {mean_text(c['val'], ci=True)} | {mean_text(c['test'], ci=True)} | {diff} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--config", default="results/.config.resolved.yaml",
                        help="the config the run used (relative to --project)")
        ap.add_argument("--threads", type=int)

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"release_levers_{args.tenant}", measure(args.project.resolve(), args.tenant, args.config,
                                                              args.threads))
        print(table())


if __name__ == "__main__":
    main()
