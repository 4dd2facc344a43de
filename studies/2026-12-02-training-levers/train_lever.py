"""A training lever against its baseline, paired row by row: two pipeline runs of one tenant over the same data
that differ only in training settings (a --configfile), each student's validation Hit@1 (what a choice sees) and
test Hit@1 (looked at after), with paired intervals lever − baseline.

Each project's students (sft, rl; plain and with release.decoding's levers) generate the validation rows again
(the release stage keeps figures, not rows); their test rows are the eval stage's own generations
(results/T/eval/<student>.jsonl), so nothing on test is generated here. The settings that differ between the two
runs' resolved configs are listed, and each run's SFT wall clock (its stats) gives the lever's cost. It only
reports: nothing here feeds back into a setting. Run it in the swift env (the students generate):

    PYTHONPATH=. .venvs/swift/bin/python bench/train_lever.py --tenant durdev --name lora_all \\
        --project ../dd --baseline ../dd12
    PYTHONPATH=. .venvs/swift/bin/python bench/train_lever.py --table

Writes bench/results/train_lever_<tenant>_<name>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import mean_text, paired_text, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.route import client_rows  # noqa: E402
from qrewrite.eval.hits import hit_at_1  # noqa: E402
from qrewrite.io_utils import read_json, read_jsonl  # noqa: E402
from qrewrite.paths import artifact_paths, eval_paths  # noqa: E402
from qrewrite.release.folder import RELEASE_FILE  # noqa: E402
from qrewrite.release.score import release_candidates, score  # noqa: E402

RESULTS = REPO / "bench" / "results"
CONFIG = "results/.config.resolved.yaml"


def flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def differing(a: dict, b: dict) -> dict:
    """Dotted key → [baseline, lever] for every setting the two resolved configs do not share."""
    fa, fb = flat(a), flat(b)
    return {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def run_rows(project: Path, tenant_name: str, threads: int | None) -> dict:
    """One run: its config, per-row validation and test Hit@1 of every candidate, its SFT stats."""
    os.chdir(project)  # the run's relative paths (results/, models/, the KB)
    cfg = load_config(CONFIG)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    cands = release_candidates(cfg)
    models = {"sft_merged": paths["sft_merged"], "rl_model": paths["rl_model"]}
    val = [r for r in eval_rows(paths["val"], paths["queries"], None) if r["gold_doc_ids"]]
    _, val_hits = score(cfg, tenant, val, cands, models, threads)
    test = [r for r in eval_rows(paths["test"], paths["queries"], None) if r["gold_doc_ids"]]
    # each eval candidate's test rewrites, read once: a student's plain and + history levers share its file
    generated = {src: {r["query_id"]: r["rewrite"] for r in read_jsonl(
        eval_paths(tenant_name)["rewrites"].format(candidate=src)) if r.get("set") == "test"}
                 for src in dict.fromkeys(c["source"] for c in cands)}
    texts = {}
    for c in cands:
        own = generated[c["source"]]
        if c["kind"] != "model":
            texts[c["name"]] = own
            continue
        extra = {k: v for k, v in c["decoding"].items() if k not in cfg["eval"]["generation"]}
        if set(extra) - {"append_history", "route_by_retrieval"}:
            raise SystemExit(f"{c['name']}: a lever that generates differently has no test rows in the eval stage")
        sent = client_rows(extra, cfg, tenant, test, [own[r["query_id"]] for r in test])
        texts[c["name"]] = {r["query_id"]: f["rewrite"] for r, f in zip(test, sent)}
    missing = {n: sum(r["query_id"] not in t for r in test) for n, t in texts.items()}
    if any(missing.values()):
        raise SystemExit(f"{project}: eval rewrites miss test rows {missing}: run the eval stage first")
    test_hits = hit_at_1(cfg, tenant, test, texts)
    return {"cfg": cfg, "val_ids": [r["query_id"] for r in val], "test_ids": [r["query_id"] for r in test],
            "val": val_hits, "test": test_hits, "sft": read_json(paths["stats_sft"]),
            "release": read_json(Path(paths["release"]) / RELEASE_FILE)["released"]["name"]}


def measure(tenant: str, name: str, project: Path, baseline: Path, threads: int | None) -> dict:
    base, lever = run_rows(baseline, tenant, threads), run_rows(project, tenant, threads)
    for split in ("val", "test"):
        if base[f"{split}_ids"] != lever[f"{split}_ids"]:
            raise SystemExit(f"the two runs' {split} splits differ: a training lever is compared on the same rows")
    boot = lever["cfg"]["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    out = {}
    for split in ("val", "test"):
        names = list(lever[split])
        out[split] = {
            "n": len(lever[f"{split}_ids"]),
            "baseline": {n: stats.mean_ci(base[split][n], **bkw) for n in names},
            "lever": {n: stats.mean_ci(lever[split][n], **bkw) for n in names},
            "lever_minus_baseline": {n: stats.paired(lever[split][n], base[split][n], **bkw)
                                     for n in names if n != "query_history"},
            "lever_minus_query_history": {n: stats.paired(lever[split][n], lever[split]["query_history"], **bkw)
                                          for n in names if n != "query_history"}}
    sft = {k: {key: r["sft"][key] for key in ("wall_s", "steps", "best_checkpoint", "best_eval_loss")}
           for k, r in (("baseline", base), ("lever", lever))}
    rows = lever["sft"]["schedule"]["train_rows"]
    return {"tenant": tenant, "lever": name, "project": str(project), "baseline_project": str(baseline),
            "settings_differ": differing(base["cfg"], lever["cfg"]), "train_rows": rows, "sft": sft,
            "sft_s_per_100_rows": {k: round(v["wall_s"] * 100 / rows, 1) for k, v in sft.items()},
            "released": {"baseline": base["release"], "lever": lever["release"]}, **out}


def table() -> str:
    lines = ["| tenant | lever | student | validation: baseline → lever (lever − baseline) | test: baseline → lever "
             "(lever − baseline) | SFT s per 100 rows |", "|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("train_lever_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        cost = doc["sft_s_per_100_rows"]
        for n, d in doc["val"]["lever_minus_baseline"].items():
            v, t = doc["val"], doc["test"]
            lines.append(f"| {doc['tenant']} | {doc['lever']} | {n} | {mean_text(v['baseline'][n])} → {mean_text(v['lever'][n])} "
                         f"({paired_text(d)}) | {mean_text(t['baseline'][n])} → {mean_text(t['lever'][n])} "
                         f"({paired_text(t['lever_minus_baseline'][n])}) | {cost['baseline']} → {cost['lever']} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--name", help="the lever's name (the result file's)")
        ap.add_argument("--baseline", type=Path, help="the baseline run's project folder")
        ap.add_argument("--threads", type=int)

    args = study_args(__doc__, required=("tenant", "name", "baseline"), add=add, table=table)
    if args:
        write_result(f"train_lever_{args.tenant}_{args.name}",
                     measure(args.tenant, args.name, args.project.resolve(), args.baseline.resolve(), args.threads))
        print(table())


if __name__ == "__main__":
    main()
