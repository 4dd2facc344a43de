"""The distilled judge's study: base vs SFT vs GRPO judge beside the rule judge, per tenant, from a
finished `snakemake judge` run (reports/T/judge.json), kept in bench/results/judge_study_<tenant>[_<label>].json
with the judge settings the run used and how it was run (each study run has a label; A, the first, no suffix).
`--table` prints every kept result as the table of docs/signals.md. Runs nothing: the study itself is
`snakemake --cores 2 judge` (tens of minutes a tenant on 2 cores).

    .venv/bin/python bench/judge_study.py --from-run /tmp/clone --label B --run-note "fresh clone, 2 idle cores, ..."
    .venv/bin/python bench/judge_study.py --table
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from common import RESULTS, write_result
from qrewrite.io_utils import read_json

JUDGES = ("base", "sft", "grpo", "sft+rule", "grpo+rule", "rule", "api")  # +rule: reward.judge.model.rule_weight


def _ci(m: dict | None) -> str:
    if not m or m.get("value") is None:
        return "—"
    return f"{m['value']:.3f} [{m['ci_low']:.2f}, {m['ci_high']:.2f}]"


def _delta(m: dict | None) -> str:
    if not m or m.get("value") is None:
        return "—"
    return f"{m['value']:+.3f} [{m['ci_low']:+.2f}, {m['ci_high']:+.2f}]"


def table() -> str:
    rows = ["| study | tenant | judge | held-out accuracy | format | held-out AUC | hand-label AUC "
            "| student-rewrite AUC | rollout AUC | rollout AUC − rule (paired) | s / judgement |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    docs = [read_json(p) for p in RESULTS.glob("judge_study_*.json")]
    for doc in sorted(docs, key=lambda d: (d.get("label", "A"), d["report"]["tenant"])):
        rep = doc["report"]
        label = doc.get("label", "A")
        n = {k: f"{v['n']} ({v['good']} good)" for k, v in rep["sets"].items()}
        for name in JUDGES:
            j = rep["judges"].get(name)
            if not j:
                continue
            held = j.get("heldout", {})
            rows.append(f"| {label} | {rep['tenant']} | {name} | {_ci(held.get('accuracy'))} | "
                        f"{held.get('format_valid', '—')} | {_ci(held.get('auc'))} | "
                        f"{_ci(j.get('hand', {}).get('auc'))} | {_ci(j.get('student', {}).get('auc'))} | "
                        f"{_ci(j.get('rollouts', {}).get('auc'))} | "
                        f"{_delta(j.get('rollouts', {}).get('auc_minus_rule'))} | "
                        f"{j.get('seconds_per_judgement', '—')} |")
        rows.append(f"| {label} | {rep['tenant']} | *items* | {n.get('heldout', '—')} | | | {n.get('hand', '—')} | "
                    f"{n.get('student', '—')} | {n.get('rollouts', '—')} | | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-run", type=Path, help="a folder where `snakemake judge` finished")
    ap.add_argument("--run-note", help="how the run was made (config overrides, cores, idle or not)")
    ap.add_argument("--label", default="A", help="the study's label (A: the first; kept apart by file name)")
    ap.add_argument("--table", action="store_true", help="print every kept result as a markdown table")
    args = ap.parse_args()
    if args.from_run:
        reports = sorted(args.from_run.glob("reports/*/judge.json"))
        if not reports:
            raise SystemExit(f"no reports/*/judge.json under {args.from_run}: run `snakemake judge` there first")
        resolved = yaml.safe_load((args.from_run / "results" / ".config.resolved.yaml").read_text(encoding="utf-8"))
        for rep in reports:
            doc = read_json(rep)
            stats = args.from_run / "results" / doc["tenant"] / "stats"
            extra = {k: read_json(stats / f"{k}.json")
                     for k in ("judge_data", "judge_sft", "judge_grpo") if (stats / f"{k}.json").is_file()}
            suffix = "" if args.label == "A" else f"_{args.label}"
            out = write_result(f"judge_study_{doc['tenant']}{suffix}", {"label": args.label,
                "what": "reports/T/judge.json of one `snakemake judge` run, with the judge settings it used",
                "run_note": args.run_note, "judge_config": resolved.get("judge"),
                "reward_judge": resolved.get("reward", {}).get("judge", {}).get("provider"),
                # what the model judges were shown beside the reference (0: no key terms; before F: not a setting)
                "key_terms": resolved.get("reward", {}).get("judge", {}).get("model", {}).get("key_terms", 0),
                "stats": extra, "report": doc})
            print(f"wrote {out}")
    if args.table or not args.from_run:
        print(table())


if __name__ == "__main__":
    main()
