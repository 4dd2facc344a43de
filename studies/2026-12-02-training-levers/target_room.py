"""Room for "targets chosen by retrieval" (for a student that trails query + history): before paying for an SFT run
that trains on, per row, whichever of the teacher's rewrite, the teacher's rewrite + the history, the teacher's
rewrite + the history terms it dropped, and query + history retrieves gold best, count the training rows where that
choice differs from the teacher's rewrite at all. Nothing is trained; only the tenant's retriever is called (local
BM25, or the RAG service's cache).

    PYTHONPATH=. .venv/bin/python bench/target_room.py --project /path/to/run --tenant durdev

Reads the project's config (`--config`, default results/.config.resolved.yaml) and results/T/sft/{train,val}.jsonl; writes
bench/results/target_room_<tenant>.json; `--table` prints every result.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, study_args, write_result  # noqa: E402

from qrewrite.config import merged_config_files, tenant_config, validate_config  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.route import with_history  # noqa: E402
from qrewrite.eval.hits import hit_at_1  # noqa: E402
from qrewrite.io_utils import read_jsonl  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402
from qrewrite.training.sft.targets import target_texts  # noqa: E402

# cheapest (closest to the teacher) first: a row's retrieval-chosen target is the first with the best Hit@1
TARGETS = ("teacher", "teacher+dropped_terms", "teacher+history", "query_history")


def chosen(per_row: dict[str, list]) -> list[str]:
    """Per row, the first target (TARGETS order) with the best Hit@1."""
    out = []
    for i in range(len(per_row["teacher"])):
        best = max(per_row[t][i] or 0.0 for t in TARGETS)
        out.append(next(t for t in TARGETS if (per_row[t][i] or 0.0) == best))
    return out


def measure(project: Path, tenant_name: str, configs: list[str]) -> dict:
    os.chdir(project)
    cfg = validate_config(merged_config_files(configs), source=" + ".join(configs))
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    doc = {"tenant": tenant_name, "project": str(project), "targets": list(TARGETS), "splits": {}}
    for split in ("train", "val"):
        rows = [r for r in eval_rows(paths[split], paths["queries"], None) if r["gold_doc_ids"]]
        teacher = {s["meta"]["query_id"]: s["messages"][-1]["content"] for s in read_jsonl(paths[split])}
        by_row = {r["query_id"]: {**target_texts(teacher[r["query_id"]], r, tenant["language"]),
                                  "query_history": with_history(r["query"], r)} for r in rows}
        texts = {t: {q: x[t] for q, x in by_row.items()} for t in TARGETS}
        per_row = hit_at_1(cfg, tenant, rows, texts)
        pick = chosen(per_row)
        n = len(rows)
        doc["splits"][split] = {
            "n": n, "hit_at_1": {t: round(sum(x or 0.0 for x in per_row[t]) / n, 4) for t in TARGETS},
            "teacher_below_1": sum(1 for x in per_row["teacher"] if (x or 0.0) < 1.0),
            "target_changes": {t: pick.count(t) for t in TARGETS if t != "teacher"},
            "changed_rows": sum(1 for p in pick if p != "teacher"),
            "retrieval_chosen_hit_at_1": round(sum(max(per_row[t][i] or 0.0 for t in TARGETS)
                                                   for i in range(n)) / n, 4)}
    return doc


def table() -> str:
    lines = ["| tenant | split (rows) | teacher Hit@1 | retrieval-chosen Hit@1 | rows whose target changes |",
             "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("target_room_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for split, s in doc["splits"].items():
            how = ", ".join(f"{t} {k}" for t, k in s["target_changes"].items() if k)
            lines.append(f"| {doc['tenant']} | {split} ({s['n']}) | {s['hit_at_1']['teacher']:.3f} | "
                         f"{s['retrieval_chosen_hit_at_1']:.3f} | {s['changed_rows']}"
                         f"{f' ({how})' if how else ''} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--config", nargs="+", default=["results/.config.resolved.yaml"],
                        help="the config files the run used, merged in order (relative to --project)")

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"target_room_{args.tenant}", measure(args.project.resolve(), args.tenant, args.config))
        print(table())


if __name__ == "__main__":
    main()
