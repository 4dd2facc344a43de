"""Which confidence should `route_by_retrieval` route on? Per row, each text the lever chooses among (the student's
rewrite, it + the history, query + history) is sent to the tenant's RAG once; the rules below then pick a text
per row from the same hits, so they are compared on the same retrievals, paired:

* top1 (what qrewrite.runtime.route ships): the top hit's score;
* margin: the top hit's lead over the second;
* ratio: that lead as a share of the top score;
* top1+margin: the two added;
* oracle: the part that scores best on gold (not a rule: the ceiling of choosing among these texts).

The students' rewrites are the run's own: validation rows from the rl stage's generations (what the release
scored, results/T/train/rl-val-rewrites.json), test rows from the eval stage's. Only retrieval runs here. It only
reports: the shipped rule is qrewrite.runtime.route's. Run in the swift env, per finished pipeline run:

    PYTHONPATH=. .venvs/swift/bin/python bench/route_confidence.py --project ../run --tenant fivedoctors
    PYTHONPATH=. .venvs/swift/bin/python bench/route_confidence.py --table

Writes bench/results/route_confidence_<tenant>.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.route import PARTS, choose, part_texts  # noqa: E402
from qrewrite.io_utils import read_json, read_jsonl  # noqa: E402
from qrewrite.metrics import gold_ranking  # noqa: E402
from qrewrite.paths import artifact_paths, eval_paths  # noqa: E402
from qrewrite.rag.providers import make_rag  # noqa: E402

CONFIG = "results/.config.resolved.yaml"
STUDENTS = ("sft", "rl")


def _lead(scores: list[float]) -> float:
    return (scores[0] - scores[1]) if len(scores) > 1 else (scores[0] if scores else 0.0)


# a rule: a part's top two scores, highest first → its confidence; route.choose picks (a tie keeps the cheaper part)
RULES = {
    "top1": lambda s: s[0] if s else 0.0,
    "margin": _lead,
    "ratio": lambda s: _lead(s) / s[0] if s and s[0] > 0 else 0.0,
    "top1+margin": lambda s: (s[0] if s else 0.0) + _lead(s),
}


def pick(parts: dict[str, dict], rule) -> str:
    return choose({p: rule(parts[p]["scores"]) for p in PARTS})


def rule_hits(records: list[dict]) -> dict[str, float]:
    """Each rule's mean tie-aware Hit@1 over `records` (rows of one split and student), and the oracle's."""
    n = len(records)
    out = {p: sum(r["parts"][p]["hit"] for r in records) / n for p in PARTS}
    for name, rule in RULES.items():
        out[name] = sum(r["parts"][pick(r["parts"], rule)]["hit"] for r in records) / n
    out["oracle"] = sum(max(r["parts"][p]["hit"] for p in PARTS) for r in records) / n
    return {k: round(v, 6) for k, v in out.items()}


def student_texts(tenant_name: str) -> dict[tuple[str, str], dict[str, str]]:
    """(split, student) → query id → the student's own rewrite."""
    texts = {}
    for g in read_json(f"results/{tenant_name}/train/rl-val-rewrites.json")["generations"]:
        if g["name"] in STUDENTS:
            texts[("val", g["name"])] = {qid: t for (qid, _), t in zip(g["prompts"], g["rewrites"])}
    for student in STUDENTS:
        rows = read_jsonl(eval_paths(tenant_name)["rewrites"].format(candidate=student))
        texts[("test", student)] = {r["query_id"]: r["rewrite"] for r in rows if r.get("set") == "test"}
    return texts


def measure(project: Path, tenant_name: str) -> dict:
    os.chdir(project)  # the run's relative paths (results/, the KB)
    cfg = load_config(CONFIG)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    splits = {s: [r for r in eval_rows(paths[s], paths["queries"], None) if r["gold_doc_ids"]] for s in ("val", "test")}
    texts = student_texts(tenant_name)

    async def retrieve() -> list[dict]:
        rag = make_rag(cfg, tenant)
        out = []
        try:
            for (split, student), own in texts.items():
                for row in splits[split]:
                    pt = part_texts(own.get(row["query_id"]) or "", row)
                    parts = {}
                    for p in PARTS:
                        hits = await rag.search(row["query"], pt[p]) if pt[p] else []
                        # the rules read the top two scores: only those are kept
                        parts[p] = {"scores": sorted((float(h["reranker_score"]) for h in hits), reverse=True)[:2],
                                    "hit": gold_ranking(hits, row["gold_doc_ids"])["hit_at_1"]}
                    out.append({"split": split, "student": student, "query_id": row["query_id"], "parts": parts})
        finally:
            await rag.aclose()
        return out

    records = asyncio.run(retrieve())
    figures = {f"{split}/{student}": {"n": len(rs), **rule_hits(rs)} for (split, student) in texts
               if (rs := [r for r in records if r["split"] == split and r["student"] == student])}
    return {"tenant": tenant_name, "project": str(project), "rules": list(RULES), "parts": list(PARTS),
            "figures": figures, "rows": records}


def table() -> str:
    cols = [*RULES, "oracle"]
    lines = ["| tenant | split / student (rows) | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for f in sorted(RESULTS.glob("route_confidence_*.json")):
        doc = json.loads(f.read_text())
        for key, fig in doc["figures"].items():
            best = max(fig[c] for c in RULES)
            cells = [f"**{fig[c]:.3f}**" if c in RULES and fig[c] == best else f"{fig[c]:.3f}" for c in cols]
            lines.append(f"| {doc['tenant']} | {key} ({fig['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = study_args(__doc__, table=table)
    if args:
        write_result(f"route_confidence_{args.tenant}", measure(args.project.resolve(), args.tenant))
        print(table())


if __name__ == "__main__":
    main()
