"""Checks that a training signal measures what its name says, against the tenant's gold labels.

``score_agreement``: does the retrieval quality score q prefer the text that finds the gold document?
For every query with gold, four texts: the raw query, the teacher's rewrite, the query with the
history pasted after it, and the query with the gold document's entity written in (its referent
filled). Over every pair of different texts of which exactly one puts a gold document alone at rank 1
(tie-aware Hit@1 = 1, the other < 1), agreement is the share of pairs where q is strictly higher for
that one. A constant or vague-query-loving score lands near or below 0.5.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools

from .entities import EntityLexicon
from .metrics import gold_ranking, retrieval_quality
from .text import normalize
from .referent import fill_referent

TEXTS = ("raw", "teacher", "query_history", "referent_filled")


def agreement_texts(query: dict, teacher_rewrite: str | None, lexicon: EntityLexicon) -> dict[str, str]:
    texts = {"raw": query["query"], "query_history": f"{query['query']} {query.get('history') or ''}".strip()}
    if teacher_rewrite:
        texts["teacher"] = teacher_rewrite
    entity = next((lexicon.doc_entity.get(d) for d in query["gold_doc_ids"] if lexicon.doc_entity.get(d)), None)
    if entity:
        asked = query["query"]
        ms = lexicon.mentions(asked) if len(asked) == len(asked.lower()) else []
        texts["referent_filled"] = (asked[:ms[0].start] + entity + asked[ms[0].end:]) if ms \
            else fill_referent(asked, entity)
    return texts


def agreement(rows: list[dict]) -> dict:
    """``rows``: per query, {text kind: (tie-aware Hit@1, q)}; see the module docstring."""
    agree = total = 0
    by_pair: dict[str, list[int]] = {}
    for res in rows:
        for a, b in itertools.combinations(sorted(res), 2):
            (ha, qa), (hb, qb) = res[a], res[b]
            if max(ha, hb) != 1.0 or min(ha, hb) == 1.0:
                continue
            right, wrong = (a, b) if ha > hb else (b, a)
            ok = int((qa > qb) if ha > hb else (qb > qa))
            agree += ok
            total += 1
            pair = by_pair.setdefault(f"{right}>{wrong}", [0, 0])
            pair[0] += ok
            pair[1] += 1
    return {"agreement": round(agree / total, 4) if total else None, "pairs": total, "agreed": agree,
            "by_pair": {k: {"agreed": v[0], "pairs": v[1]} for k, v in sorted(by_pair.items())}}


async def score_agreement(rag, queries: list[dict], teacher: dict[str, str], lexicon: EntityLexicon,
                          quality: str) -> dict:
    """Agreement of ``rag``'s q (formula ``quality``) with gold over the texts of every gold query."""
    async def one(query_row: dict) -> dict:
        texts = agreement_texts(query_row, teacher.get(query_row["id"]), lexicon)
        unique: dict[str, str] = {}
        for kind, text in texts.items():
            unique.setdefault(text, kind)  # identical texts are one text, not a pair
        found = await asyncio.gather(*(rag.search(query_row["query"], text) for text in unique))
        return {kind: (gold_ranking(hits, query_row["gold_doc_ids"])["hit_at_1"], retrieval_quality(hits, quality))
                for kind, hits in zip(unique.values(), found)}

    # Concurrent across queries: the RAG client bounds the calls in flight.
    rows = await asyncio.gather(*(one(row) for row in queries if row.get("gold_doc_ids")))
    return {**agreement(rows), "texts": list(TEXTS), "queries": len(rows), "quality": quality}


def auc(scores_good: list[float], scores_bad: list[float]) -> float | None:
    """Area under the ROC curve: P(a good rewrite outscores a bad one), ties counting one half."""
    if not scores_good or not scores_bad:
        return None
    wins = sum((g > b) + 0.5 * (g == b) for g in scores_good for b in scores_bad)
    return round(wins / (len(scores_good) * len(scores_bad)), 4)


def load_judge_labels(path: str) -> list[dict]:
    """A labelled judge set: JSONL rows {query, profile, history, rewrite, label: good|bad, failure}."""
    from .errors import QrewriteError
    from .io_utils import read_jsonl

    rows = read_jsonl(path)
    for i, r in enumerate(rows, 1):
        for key in ("query", "rewrite", "label"):
            if not isinstance(r.get(key), str):
                raise QrewriteError(f"missing or non-string field {key!r}", file=path, row=i, column=key,
                                    hint="each row needs query, profile, history, rewrite, label (good|bad)")
        if r["label"] not in ("good", "bad"):
            raise QrewriteError(f"label {r['label']!r} is not good or bad", file=path, row=i, column="label")
    return rows


def derived_judge_labels(validated: list[dict], queries: list[dict]) -> list[dict]:
    """A labelled set for the judge derived from the tenant's own data half, no hand labels needed.

    Good: a validated teacher rewrite that puts a gold document alone at rank 1 (tie-aware Hit@1 = 1), or, for a
    query without gold, that retrieves better than the raw query (gain > 0). For each good row, two bad ones:
    the raw query where it differs from the rewrite (``raw``: what the rewrite had to resolve is missing), and
    another good row's rewrite (``other_row``: fluent, but another conversation's referent and ask), picked by
    a hash of the ids. Every row carries the good rewrite as ``reference``, as the RL reward and eval judge it.
    """
    context = {q["id"]: q for q in queries}
    good = []
    for v in validated:
        rewrite = (v.get("rewrite") or "").strip()
        q = context.get(v["id"])
        if not rewrite or q is None:
            continue
        rag = v.get("rewrite_rag") or {}
        ok = rag.get("hit_at_1") == 1.0 if v.get("gold_doc_ids") else (v.get("gain") or 0.0) > 0.0
        if ok:
            good.append({"query_id": v["id"], "query": q["query"], "profile": q.get("profile") or "",
                         "history": q.get("history") or "", "reference": rewrite})
    order = sorted(range(len(good)), key=lambda i: hashlib.sha256(good[i]["query_id"].encode()).hexdigest())
    rows = []
    for pos, i in enumerate(order):
        g = good[i]
        rows.append({**g, "rewrite": g["reference"], "label": "good", "failure": None})
        if normalize(g["query"]) != normalize(g["reference"]):
            rows.append({**g, "rewrite": g["query"], "label": "bad", "failure": "raw"})
        for step in range(1, len(order)):
            o = good[order[(pos + step) % len(order)]]
            if normalize(o["reference"]) != normalize(g["reference"]) and normalize(o["query"]) != normalize(g["query"]):
                rows.append({**g, "rewrite": o["reference"], "label": "bad", "failure": "other_row"})
                break
    return rows


def heldout(query: str) -> bool:
    """Half of a hand-labelled set, by a hash of the question (all rewrites of one question on one side), that
    no judge rule may be tuned on: the judge's check reports its AUC there apart."""
    return hashlib.sha256(normalize(query).encode("utf-8")).digest()[0] % 2 == 1


async def judge_auc(judge, rows: list[dict]) -> dict:
    """The judge's AUC on a labelled set, overall and for each failure type (bad rows of that type vs
    every good row); judge failures count as the lowest score."""
    scores = []
    for r in rows:
        v = await judge.judge(r["query"], r.get("profile") or "", r.get("history") or "", r["rewrite"],
                              r.get("reference"))
        scores.append(v.score if v.score is not None else 0.0)
    good = [s for s, r in zip(scores, rows) if r["label"] == "good"]
    bad = [(s, r.get("failure") or "unspecified") for s, r in zip(scores, rows) if r["label"] == "bad"]
    per_type = {}
    for f in sorted({f for _, f in bad}):
        per_type[f] = {"auc": auc(good, [s for s, g in bad if g == f]), "n": sum(1 for _, g in bad if g == f)}
    return {"auc": auc(good, [s for s, _ in bad]), "n_good": len(good), "n_bad": len(bad),
            "mean_good": round(sum(good) / len(good), 4) if good else None,
            "mean_bad": round(sum(s for s, _ in bad) / len(bad), 4) if bad else None,
            "by_failure": per_type}
