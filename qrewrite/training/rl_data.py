"""RL prompts from the SFT splits: the same chat prompt the SFT model was trained on, plus the teacher's
precomputed side (rewrite, retrieval, gold docs) as the reward's ground truth. RL makes no teacher calls.

Two layouts of the same rows:
* `train.parquet` / `val.parquet`: verl's RL layout (`qrewrite.rl.verl_dataset`);
* `train.swift.jsonl` / `val.swift.jsonl`: ms-swift GRPO rows, `messages` (system + user) plus the
  columns the reward plugin reads (`tenant`, `ground_truth`).
Both carry the same ground truth (`qrewrite.reward.ground_truth`: the query, its profile and history, the
teacher side), so the two reward adapters score a rollout on the same record.
"""

from __future__ import annotations

from ..errors import QrewriteError
from ..io_utils import read_jsonl, write_jsonl
from ..reward.ground_truth import encode_ground_truth
from ..rl.verl_dataset import write_verl_parquet


def rl_records(sft_rows: list[dict], queries: dict[str, dict], source: str) -> list[dict]:
    """One record per SFT sample: prompt messages (no assistant turn) + teacher side from `meta`."""
    out = []
    for i, row in enumerate(sft_rows, start=1):
        meta = row.get("meta") or {}
        qid = meta.get("query_id")
        q = queries.get(qid)
        if q is None:
            raise QrewriteError(f"query id {qid!r} is not in queries.jsonl", file=source, row=i,
                                hint="the SFT split and queries.jsonl come from different runs; rerun the data stages")
        prompt = [m for m in row["messages"] if m["role"] != "assistant"]
        teacher = next((m["content"] for m in row["messages"] if m["role"] == "assistant"), None)
        hits = meta.get("teacher_hits") or []
        out.append({
            "query_id": qid, "tenant": meta["tenant"], "query": q["query"], "profile": q.get("profile") or "",
            "history": q.get("history") or "", "prompt": prompt, "teacher_rewrite": teacher,
            "teacher_retrieval": {"top1": meta.get("teacher_top1"), "mean_top3": meta.get("teacher_mean_top3"),
                                  "doc_ids": [h["doc_id"] for h in hits],
                                  "hits": [{"doc_id": h["doc_id"], "reranker_score": h["reranker_score"]}
                                           for h in hits if "reranker_score" in h]},
            "gold_doc_ids": meta.get("gold_doc_ids") or [],
        })
    return out


def swift_row(rec: dict) -> dict:
    return {"messages": rec["prompt"], "tenant": rec["tenant"], "ground_truth": encode_ground_truth(rec)}


def write_rl_data(*, train: str, val: str, queries: str, out: dict[str, str], val_share: float = 1.0) -> dict:
    """Write the four RL files (`out` keys: train, val, train_swift, val_swift); return row counts."""
    by_id = {q["id"]: q for q in read_jsonl(queries)}
    counts = {}
    for split, src in (("train", train), ("val", val)):
        recs = rl_records(read_jsonl(src), by_id, src)
        if split == "val":
            recs = recs[: max(1, round(len(recs) * val_share))]
        if not recs:
            raise QrewriteError(f"no {split} rows for RL", file=src, hint="the SFT split is empty; check the filters")
        write_verl_parquet(recs, out[split], split=split, build_messages=lambda r: r["prompt"])
        write_jsonl(out[f"{split}_swift"], (swift_row(r) for r in recs))
        counts[split] = len(recs)
    return counts
