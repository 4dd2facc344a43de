"""RL prompts from the SFT splits: the same chat prompt the SFT model was trained on, plus the teacher's
precomputed side (rewrite, retrieval, gold docs) as the reward's ground truth. RL makes no teacher calls.

Two layouts of the same rows:
* `train.parquet` / `val.parquet`: verl's RL layout (`qrewrite.training.rl.verl.dataset`);
* `train.swift.jsonl` / `val.swift.jsonl`: ms-swift GRPO rows, `messages` (system + user) plus the
  columns the reward plugin reads (`tenant`, `ground_truth`).
Both carry the same ground truth (`qrewrite.reward.ground_truth`: the query, its profile and history, the
teacher side), so the two reward adapters score a rollout on the same record.
"""

from __future__ import annotations

from ...errors import QrewriteError
from ...io_utils import read_jsonl, write_jsonl
from ...reward.ground_truth import encode_ground_truth
from .verl.dataset import write_verl_parquet


def rl_records(sft_rows: list[dict], queries: dict[str, dict], source: str) -> list[dict]:
    """One record per SFT sample: prompt messages (no assistant turn) + teacher side from `meta`."""
    out = []
    for i, row in enumerate(sft_rows, start=1):
        meta = row.get("meta") or {}
        qid = meta.get("query_id")
        query_row = queries.get(qid)
        if query_row is None:
            raise QrewriteError(f"query id {qid!r} is not in queries.jsonl", file=source, row=i,
                                hint="the SFT split and queries.jsonl come from different runs; rerun the data stages")
        prompt = [m for m in row["messages"] if m["role"] != "assistant"]
        teacher = next((m["content"] for m in row["messages"] if m["role"] == "assistant"), None)
        hits = meta.get("teacher_hits") or []
        out.append({
            "query_id": qid, "tenant": meta["tenant"], "query": query_row["query"], "profile": query_row.get("profile") or "",
            "history": query_row.get("history") or "", "prompt": prompt, "teacher_rewrite": teacher,
            "teacher_retrieval": {"top1": meta.get("teacher_top1"), "mean_top3": meta.get("teacher_mean_top3"),
                                  "doc_ids": [h["doc_id"] for h in hits],
                                  "hits": [{"doc_id": h["doc_id"], "reranker_score": h["reranker_score"]}
                                           for h in hits if "reranker_score" in h]},
            "gold_doc_ids": meta.get("gold_doc_ids") or [],
        })
    return out


def red_team_records(rows: list[dict], tenant: dict) -> list[dict]:
    """RL records of red-team rows (qrewrite.data.red_team): the SFT prompt, no teacher side; the ground truth carries
    the row's checks, and the reward is theirs (scorer: +1 all pass, else -1 + share passed)."""
    from ...prompts import rewrite_messages

    return [{"query_id": r["query_id"], "tenant": tenant["name"], "query": r["query"], "profile": r["profile"],
             "history": r["history"], "prompt": rewrite_messages(tenant, r), "teacher_rewrite": None,
             "teacher_retrieval": {}, "gold_doc_ids": [],
             "red_team": {"attack": r["attack"], "expect": r["expect"]}} for r in rows]


def mix_in(records: list[dict], extra: list[dict], share: float) -> list[dict]:
    """`records` with red-team records making up `share` of the result, spread evenly through it (the SFT rows
    keep their order). When there are fewer red-team rows than the share needs, they repeat in order: the
    share is the contract, the repetition is counted by the caller."""
    if not extra or share <= 0:
        return list(records)
    n = round(share * len(records) / (1.0 - share))
    picked = [extra[i % len(extra)] for i in range(n)]
    out, step = list(records), (len(records) + n) / max(n, 1)
    for k, rec in enumerate(picked):
        out.insert(min(int(k * step + step / 2), len(out)), rec)
    return out


def swift_row(rec: dict) -> dict:
    return {"messages": rec["prompt"], "tenant": rec["tenant"], "ground_truth": encode_ground_truth(rec)}


def write_rl_data(*, train: str, val: str, queries: str, out: dict[str, str], val_share: float = 1.0,
                  red_team: list[dict] | None = None, red_team_share: float = 0.0, tenant: dict | None = None) -> dict:
    """Write the four RL files (`out` keys: train, val, train_swift, val_swift); return row counts. `red_team`:
    the tenant's red-team rows for RL, mixed into the train prompts at `red_team_share` (val stays the SFT val)."""
    by_id = {row["id"]: row for row in read_jsonl(queries)}
    counts = {}
    for split, src in (("train", train), ("val", val)):
        recs = rl_records(read_jsonl(src), by_id, src)
        if split == "val":
            recs = recs[: max(1, round(len(recs) * val_share))]
        elif red_team:
            n_sft = len(recs)
            recs = mix_in(recs, red_team_records(red_team, tenant), red_team_share)
            counts["train_red_team"] = len(recs) - n_sft
            counts["train_red_team_unique"] = min(len(red_team), len(recs) - n_sft)
        if not recs:
            raise QrewriteError(f"no {split} rows for RL", file=src, hint="the SFT split is empty; check the filters")
        write_verl_parquet(recs, out[split], split=split, build_messages=lambda r: r["prompt"])
        write_jsonl(out[f"{split}_swift"], (swift_row(r) for r in recs))
        counts[split] = len(recs)
    return counts
