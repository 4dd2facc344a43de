"""The RL ground truth: everything the reward needs about one query besides the rollout, in one record.

Both RL layouts carry it as the same JSON string (`qrewrite.training.rl.data`): verl's parquet in
``reward_model.ground_truth``, ms-swift's JSONL in the ``ground_truth`` column. Both reward adapters
(``verl_reward.py``, ``swift_plugin.py``) read the query's context from it and nowhere else, so the judge
sees the same question, profile and history whichever framework trains. Only json here: the data env
writes it, the training envs read it.

Keys: ``query_id``, ``query``, ``profile``, ``history`` (the conversation the rewrite must resolve; ""
when the user has none), ``teacher_rewrite``, ``teacher_retrieval`` (``top1``, ``mean_top3``,
``doc_ids``[, ``hits``]), ``gold_doc_ids``[, ``red_team``: a red-team row's checks].
"""

from __future__ import annotations

import json
from typing import Any, Mapping

# The query's context: required in every record (a missing key is the bug this module exists to stop:
# a judge scoring a rewrite without the history it must resolve).
CONTEXT_KEYS = ("query_id", "query", "profile", "history")


class GroundTruthError(ValueError):
    """A ground truth lacking a context key: written by an older qrewrite, or built by hand."""


def make_ground_truth(record: Mapping[str, Any]) -> dict[str, Any]:
    """The ground truth of one RL record (JSON-serialisable). ``record``: the CONTEXT_KEYS, and the
    teacher side ``teacher_rewrite``, ``teacher_retrieval``, ``gold_doc_ids`` (absent: retrieved or
    unlabelled at scoring time, as the scorer documents)."""
    missing = [k for k in CONTEXT_KEYS if k not in record]
    if missing:
        raise GroundTruthError(f"RL record lacks {missing} (have {sorted(record)})")
    tr = record.get("teacher_retrieval") or {}
    return {
        "query_id": None if record["query_id"] is None else str(record["query_id"]),  # None: the scorer hashes the query
        "query": str(record["query"]),
        "profile": str(record["profile"] or ""),
        "history": str(record["history"] or ""),
        "teacher_rewrite": record.get("teacher_rewrite"),
        "teacher_retrieval": {
            "top1": None if tr.get("top1") is None else float(tr["top1"]),
            "mean_top3": None if tr.get("mean_top3") is None else float(tr["mean_top3"]),
            "doc_ids": [str(d) for d in (tr.get("doc_ids") or [])],
            # scored hits: the rank term's pseudo-label is the teacher's top document unless it is tied
            **({"hits": [{"doc_id": str(h["doc_id"]), "reranker_score": float(h["reranker_score"])}
                         for h in tr["hits"]]} if tr.get("hits") else {}),
        },
        "gold_doc_ids": [str(d) for d in (record.get("gold_doc_ids") or [])],
        # a red-team row: its checks replace the teacher comparison in the reward (qrewrite.data.red_team)
        **({"red_team": record["red_team"]} if record.get("red_team") else {}),
    }


def encode_ground_truth(record: Mapping[str, Any]) -> str:
    """``make_ground_truth`` as the JSON string both layouts store (a string, not a nested struct, keeps
    the parquet schema identical for every row: no null/empty-list struct promotion by arrow)."""
    return json.dumps(make_ground_truth(record), ensure_ascii=False)


def parse_ground_truth(ground_truth: Any) -> dict[str, Any]:
    """Inverse of ``encode_ground_truth`` (a JSON string, bytes or dict); fails on a record without
    the query's context instead of scoring the rollout without it."""
    gt = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else dict(ground_truth)
    missing = [k for k in CONTEXT_KEYS if k not in gt]
    if missing:
        raise GroundTruthError(f"RL ground truth lacks {missing}: written by an older qrewrite? "
                               "Rerun the rl_data stage (`qrewrite rl-data`) to rewrite the RL files")
    return gt
