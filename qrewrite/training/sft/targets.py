"""SFT targets chosen by retrieval (`train.sft.targets: retrieval`; the sft_targets stage).

Per training and validation row, the target the student learns is whichever of the teacher's rewrite, it + the
history terms it dropped, and it + the whole history puts gold first in the tenant's RAG with the widest margin:
first by tie-aware Hit@1, then by gold's lead over the best other document (relative to the top score), the
cheaper text on a tie. With Hit@1 alone the teacher's rewrite already wins 86-97 % of training rows outright, and
the rest are ties no text breaks (docs/training.md, "targets chosen by retrieval"): the margin is what says that
BM25 finds the history's terms a surer way to gold, which is what a student that trails query + history lacks.
`history` trains on the teacher's rewrite + the whole history on every row: one rule for the tenant, where a per-row
choice by margin gives the student targets that differ by scores it cannot see (docs/training.md, "the history on
every row"). `teacher` copies the splits as they are. Test rows are never read.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from ...text import with_history
from ...metrics import gold_ranking
from ...text import tokenize

# cheapest (closest to the teacher's rewrite) first: a tie keeps the earlier
TARGETS = ("teacher", "teacher+dropped_terms", "teacher+history")


def with_dropped_terms(rewrite: str, row: dict, language: str) -> str:
    """The rewrite + the history's terms that neither it nor the question has, in history order."""
    have = set(tokenize(rewrite, language)) | set(tokenize(row["query"], language))
    dropped = [w for w in tokenize(row.get("history") or "", language) if w not in have]
    return f"{rewrite} {' '.join(dict.fromkeys(dropped))}".strip()


def target_texts(rewrite: str, row: dict, language: str) -> dict[str, str]:
    return {"teacher": rewrite, "teacher+dropped_terms": with_dropped_terms(rewrite, row, language),
            "teacher+history": with_history(rewrite, row)}


def gold_margin(hits: list[dict], gold: list[str]) -> float:
    """Gold's best score minus the best other document's, over the top score (0 without hits): how surely the
    text retrieves gold, comparable across texts of different lengths (a raw BM25 score grows with length)."""
    gold_set = set(gold)
    scores = [(float(h["reranker_score"]), h["doc_id"] in gold_set) for h in hits]
    top = max((s for s, _ in scores), default=0.0)
    if top <= 0:
        return 0.0
    best_gold = max((s for s, g in scores if g), default=0.0)
    best_other = max((s for s, g in scores if not g), default=0.0)
    return (best_gold - best_other) / top


def choose(scores: dict[str, tuple[float, float]]) -> str:
    """The target with the best (Hit@1, margin to 4 decimals: closer is a tie); a tie keeps the earlier (cheaper)
    in `scores`' order."""
    order = list(scores)
    return max(order, key=lambda t: (scores[t], -order.index(t)))


async def _choose_rows(rag, samples: list[dict], rows: dict[str, dict], language: str) -> list[dict]:
    async def score(row: dict, text: str) -> tuple[float, float]:
        hits = await rag.search(row["query"], text) if text else []
        return gold_ranking(hits, row["gold_doc_ids"])["hit_at_1"], round(gold_margin(hits, row["gold_doc_ids"]), 4)

    async def one(sample: dict) -> dict:
        row = rows[sample["meta"]["query_id"]]
        if not row["gold_doc_ids"]:
            return {"target": "teacher", "scores": None}
        texts = target_texts(sample["messages"][-1]["content"], row, language)
        got = await asyncio.gather(*(score(row, texts[t]) for t in TARGETS))
        scores = dict(zip(TARGETS, got))
        pick = choose(scores)
        return {"target": pick, "text": texts[pick], "scores": {t: list(s) for t, s in scores.items()}}

    return list(await asyncio.gather(*(one(s) for s in samples)))


def retarget(samples: list[dict], picks: list[dict]) -> list[dict]:
    """The samples with each assistant turn replaced by its chosen text; `meta.target` names the choice."""
    out = []
    for sample, pick in zip(samples, picks):
        messages = [dict(m) for m in sample["messages"]]
        if pick["target"] != "teacher":
            messages[-1]["content"] = pick["text"]
        out.append({**sample, "messages": messages, "meta": {**sample.get("meta", {}), "target": pick["target"]}})
    return out


def choose_targets(cfg: dict, tenant: dict, samples: list[dict], rows: dict[str, dict]) -> list[dict]:
    """Per SFT sample (chat format, meta.query_id), the choice: {target, text, scores}, through the tenant's RAG."""
    from ...rag.providers import make_rag

    async def run() -> list[dict]:
        rag = make_rag(cfg, tenant)
        try:
            return await _choose_rows(rag, samples, rows, tenant["language"])
        finally:
            await rag.aclose()

    return asyncio.run(run())


def write_targets(cfg: dict, tenant: dict, mode: str, splits: dict[str, tuple[str, str]], queries: str) -> dict:
    """Each split's SFT rows (name → (source, destination)) with `mode`'s targets (teacher, retrieval or history:
    the enum of train.sft.targets in the schema), written only once every split's were chosen. Returns per split
    {rows, chosen: count per target}."""
    from ...eval.candidates import eval_rows
    from ...io_utils import read_jsonl, write_jsonl

    out, counts = {}, {}
    for name, (src, _) in splits.items():
        # training targets only: the validation split also holds the rows the teacher failed on, which the release
        # and eval measure but SFT must neither learn nor validate its loss on
        samples = [r for r in read_jsonl(src) if (r.get("meta") or {}).get("trainable", True)]
        if mode == "teacher":
            out[name], picked = samples, ["teacher"] * len(samples)
        else:
            rows = {r["query_id"]: r for r in eval_rows(src, queries, None)}
            picks = ([{"target": "teacher+history",
                       "text": with_history(s["messages"][-1]["content"], rows[s["meta"]["query_id"]])}
                      for s in samples] if mode == "history" else choose_targets(cfg, tenant, samples, rows))
            out[name], picked = retarget(samples, picks), [p["target"] for p in picks]
        counts[name] = {"rows": len(samples), "chosen": dict(Counter(picked))}
    for name, (_, dst) in splits.items():
        write_jsonl(dst, out[name])
    return counts
