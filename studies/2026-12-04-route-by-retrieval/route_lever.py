"""Routing by the retriever's confidence: per row, send the tenant's RAG whichever of a student's rewrite,
that rewrite + the history, and query + history its top hit scores highest on (the reranker score of rank 1, which
docs/signals.md checks against gold: `signals.score_agreement`). No gold is read to route; the release's lever
`append_history` chooses one of these texts per tenant, this chooses per row.

Measured on a finished run's students (sft, rl): validation rows rewritten here (the release's generation: the rl
stage's rewrites where they are the same decoding), test rows from the eval stage's own generations. Each router's
tie-aware Hit@1 beside its parts, paired intervals against the student and against query + history; the oracle
(the best of the three per row, by gold) says how much room a router has. Run it in the swift env:

    PYTHONPATH=. .venvs/swift/bin/python bench/route_lever.py --project ../ddb --tenant durdev
    PYTHONPATH=. .venvs/swift/bin/python bench/route_lever.py --table

Writes bench/results/route_lever_<tenant>.json. It only reports: nothing here feeds back into a setting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, mean_text, paired_text, study_args, write_result  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.route import PARTS, choose, part_texts  # noqa: E402
from qrewrite.io_utils import read_jsonl  # noqa: E402
from qrewrite.metrics import gold_ranking  # noqa: E402
from qrewrite.paths import artifact_paths, eval_paths  # noqa: E402
from qrewrite.rag.providers import make_rag  # noqa: E402
from qrewrite.release.score import release_candidates, rewrites  # noqa: E402

CONFIG = "results/.config.resolved.yaml"
# the lever (route3: qrewrite.runtime.route's PARTS and choice), and two routers over two of its texts for comparison
ROUTERS = {"route_own_qh": ("own", "query_history"), "route_own_ownh": ("own", "own+history"), "route3": PARTS}


async def _retrieve(cfg: dict, tenant: dict, rows: list[dict], texts: dict[str, dict[str, str]]) -> dict:
    """name → per row (top-1 reranker score, tie-aware Hit@1)."""
    rag = make_rag(cfg, tenant)

    async def one(row: dict, text: str) -> tuple[float, float]:
        hits = await rag.search(row["query"], text) if text else []
        top = float(hits[0]["reranker_score"]) if hits else 0.0
        return top, gold_ranking(hits, row["gold_doc_ids"])["hit_at_1"]

    try:
        return {n: list(await asyncio.gather(*(one(r, t.get(r["query_id"]) or "") for r in rows)))
                for n, t in texts.items()}
    finally:
        await rag.aclose()


def routed(per: dict, parts: tuple[str, ...]) -> tuple[list[float], list[str]]:
    """Per row, the Hit@1 of the part whose top hit scores highest (ties: the earlier part), and its name."""
    hits, picks = [], []
    for i in range(len(per[parts[0]])):
        best = choose({p: per[p][i][0] for p in parts})
        hits.append(per[best][i][1])
        picks.append(best)
    return hits, picks


def measure(project: Path, tenant_name: str, threads: int | None) -> dict:
    os.chdir(project)
    cfg = load_config(CONFIG)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    plain = {c["source"]: c for c in release_candidates(cfg) if c["kind"] == "model" and
             not (set(c["decoding"]) - set(cfg["eval"]["generation"]))}
    models = {"sft_merged": paths["sft_merged"], "rl_model": paths["rl_model"]}
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    doc = {"tenant": tenant_name, "project": str(project), "parts": list(PARTS), "routers": ROUTERS,
           "rule": "per row, the part with the highest top-1 reranker score; ties keep the cheaper", "students": {}}
    generated: dict = {}
    for student, cand in plain.items():
        doc["students"][student] = {}
        for split in ("val", "test"):
            rows = [r for r in eval_rows(paths[split], paths["queries"], None) if r["gold_doc_ids"]]
            if split == "val":
                own = rewrites(cand, cfg, tenant, rows, models[cand["artifact"]], threads, generated,
                               paths.get("rl_val_rewrites"))
            else:
                ev = {r["query_id"]: r.get("model_rewrite", r["rewrite"]) for r in read_jsonl(
                    eval_paths(tenant_name)["rewrites"].format(candidate=student)) if r.get("set") == "test"}
                own = {r["query_id"]: ev[r["query_id"]] for r in rows}
            by_row = {r["query_id"]: part_texts(own[r["query_id"]], r) for r in rows}
            texts = {p: {q: t[p] for q, t in by_row.items()} for p in PARTS}
            per = asyncio.run(_retrieve(cfg, tenant, rows, texts))
            hits = {p: [h for _, h in per[p]] for p in PARTS}
            picks = {}
            for name, parts in ROUTERS.items():
                hits[name], chosen = routed(per, parts)
                picks[name] = {p: chosen.count(p) for p in parts}
            hits["oracle"] = [max(per[p][i][1] for p in PARTS) for i in range(len(rows))]
            doc["students"][student][split] = {
                "n": len(rows), "hit_at_1": {n: stats.mean_ci(v, **bkw) for n, v in hits.items()}, "picks": picks,
                "minus_own": {n: stats.paired(hits[n], hits["own"], **bkw) for n in hits if n != "own"},
                "minus_query_history": {n: stats.paired(hits[n], hits["query_history"], **bkw)
                                        for n in hits if n != "query_history"}}
    return doc


def table() -> str:
    lines = ["| tenant | student | split (rows) | own | own + history | query + history | route own/q+h | "
             "route own/own+h | route3 | route3 − own | route3 − q+h | oracle |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("route_lever_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for student, splits in doc["students"].items():
            for split, s in splits.items():
                h = s["hit_at_1"]
                lines.append(f"| {doc['tenant']} | {student} | {split} ({s['n']}) | {mean_text(h['own'])} | "
                             f"{mean_text(h['own+history'])} | {mean_text(h['query_history'])} | "
                             f"{mean_text(h['route_own_qh'])} | {mean_text(h['route_own_ownh'])} | "
                             f"{mean_text(h['route3'], ci=True)} | {paired_text(s['minus_own']['route3'])} | "
                             f"{paired_text(s['minus_query_history']['route3'])} | {mean_text(h['oracle'])} |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--threads", type=int)

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"route_lever_{args.tenant}", measure(args.project.resolve(), args.tenant, args.threads))
        print(table())


if __name__ == "__main__":
    main()
