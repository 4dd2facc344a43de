"""Write RL prompts as verl-layout parquet (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads).

One row per query:

* ``prompt``       list of chat messages ``[{"role": ..., "content": ...}, ...]``
                   (``data.prompt_key=prompt``; verl applies the chat template itself)
* ``data_source``  tenant name (``data.reward_fn_key=data_source``; passed to the
                   reward function as ``data_source``)
* ``ability``      ``"query_rewrite"``
* ``reward_model`` ``{"style": "rule", "ground_truth": <JSON string>}``: the record of
                   ``qrewrite.reward.ground_truth`` (the query and its profile and
                   history, the teacher side, gold ids), the one the reward reads.
* ``extra_info``   ``{"split", "index", "query_id", "tenant"}`` (scalars only; verl's
                   bookkeeping, e.g. ``index``; the reward reads only ``tenant``).

Only pyarrow is needed to write; reading back with RLHFDataset needs the
verl env.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

from qrewrite.reward.ground_truth import encode_ground_truth

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


def to_verl_row(
    record: Mapping[str, Any],
    index: int,
    split: str,
    build_messages: Callable[[Mapping[str, Any]], list[dict]] = default_messages,
) -> dict[str, Any]:
    """One verl row.  ``record`` keys: tenant and those of ``qrewrite.reward.ground_truth``
    (query_id, query, profile, history, teacher_rewrite, teacher_retrieval, gold_doc_ids)."""
    for k in ("query_id", "tenant", "query"):
        if record.get(k) in (None, ""):
            raise ValueError(f"record {index} lacks {k!r}")
    return {
        "data_source": str(record["tenant"]),
        "prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in build_messages(record)],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": encode_ground_truth(record)},
        "extra_info": {
            "split": split,
            "index": int(index),
            "query_id": str(record["query_id"]),
            "tenant": str(record["tenant"]),
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

    from qrewrite.io_utils import atomic_path

    rows = [to_verl_row(r, i, split, build_messages) for i, r in enumerate(records)]
    if not rows:
        raise ValueError("no records to write")
    table = pa.Table.from_pylist([{k: r[k] for k in PARQUET_COLUMNS} for r in rows])
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp))
    return len(rows)
