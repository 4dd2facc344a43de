"""Write RL prompts as verl-layout parquet (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads).

One row per query:

* ``prompt``       list of chat messages ``[{"role": ..., "content": ...}, ...]``
                   (``data.prompt_key=prompt``; verl applies the chat template itself)
* ``data_source``  tenant name (``data.reward_fn_key=data_source``; passed to the
                   reward function as ``data_source``)
* ``ability``      ``"query_rewrite"``
* ``reward_model`` ``{"style": "rule", "ground_truth": <JSON string>}``; the JSON
                   holds ``teacher_rewrite``, ``teacher_retrieval`` (``top1``,
                   ``mean_top3``, ``doc_ids``) and ``gold_doc_ids``.  A JSON string
                   (not a nested struct) keeps the parquet schema identical for
                   every row (no null/empty-list struct promotion by arrow), and
                   the reward function decodes it with ``parse_ground_truth``.
* ``extra_info``   ``{"split", "index", "query_id", "tenant", "query"}`` (scalars only;
                   reaches the reward function as ``extra_info``).

Only pyarrow is needed to write; reading back with RLHFDataset needs the
verl env.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping

ABILITY = "query_rewrite"

DEFAULT_SYSTEM_PROMPT = (
    "You rewrite search queries. Given a user query, output a single rewritten query "
    "that retrieves the most relevant documents. Output only the rewritten query."
)

PARQUET_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def default_messages(record: Mapping[str, Any], system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[dict]:
    """Chat messages for one record (override via ``build_messages=`` to match SFT)."""
    msgs = []
    if system_prompt:
        msgs.append({"role": "system", "content": system_prompt})
    msgs.append({"role": "user", "content": str(record["query"])})
    return msgs


def make_ground_truth(record: Mapping[str, Any]) -> dict[str, Any]:
    """The reward function's ground truth for one record (JSON-serialisable dict)."""
    tr = record.get("teacher_retrieval") or {}
    return {
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
        # a red-team row: its checks replace the teacher comparison in the reward (qrewrite.red_team)
        **({"red_team": record["red_team"]} if record.get("red_team") else {}),
    }


def parse_ground_truth(ground_truth: Any) -> dict[str, Any]:
    """Inverse of the ``ground_truth`` encoding (accepts JSON string or dict)."""
    if isinstance(ground_truth, (str, bytes)):
        return json.loads(ground_truth)
    return dict(ground_truth)


def to_verl_row(
    record: Mapping[str, Any],
    index: int,
    split: str,
    build_messages: Callable[[Mapping[str, Any]], list[dict]] = default_messages,
) -> dict[str, Any]:
    """One verl row.  ``record`` keys: query_id, tenant, query, teacher_rewrite,
    teacher_retrieval{top1, mean_top3, doc_ids}, gold_doc_ids."""
    for k in ("query_id", "tenant", "query"):
        if record.get(k) in (None, ""):
            raise ValueError(f"record {index} lacks {k!r}")
    return {
        "data_source": str(record["tenant"]),
        "prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in build_messages(record)],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(make_ground_truth(record), ensure_ascii=False)},
        "extra_info": {
            "split": split,
            "index": int(index),
            "query_id": str(record["query_id"]),
            "tenant": str(record["tenant"]),
            "query": str(record["query"]),
        },
    }


def write_verl_parquet(
    records: Iterable[Mapping[str, Any]],
    path: str | os.PathLike,
    split: str,
    build_messages: Callable[[Mapping[str, Any]], list[dict]] = default_messages,
) -> int:
    """Write ``records`` as a verl RL parquet at ``path`` (atomically); returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..io_utils import atomic_path

    rows = [to_verl_row(r, i, split, build_messages) for i, r in enumerate(records)]
    if not rows:
        raise ValueError("no records to write")
    table = pa.Table.from_pylist([{k: r[k] for k in PARQUET_COLUMNS} for r in rows])
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp))
    return len(rows)
