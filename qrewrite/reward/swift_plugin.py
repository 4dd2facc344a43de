"""ms-swift 4.x GRPO plugin: the qrewrite reward as ORM ``qrewrite_reward``.

Use::

    QREWRITE_CONFIG=/abs/path/config.yaml swift rlhf --rlhf_type grpo ... \\
        --external_plugins qrewrite/reward/swift_plugin.py --reward_funcs qrewrite_reward

ms-swift 4.6 API relied on (``swift/rewards/orm.py``, ``swift/rl_core/grpo_algorithm.py``,
``swift/utils/utils.py:import_external_file``):

* ``--external_plugins FILE`` runs ``import_external_file(FILE)``: the file is executed as module
  ``_swift_external_<sha256>`` with its directory put first on ``sys.path``; registering is the
  import side effect ``orms[name] = cls`` into ``swift.rewards.orms``.
* the trainer instantiates the class once as ``cls(args=<GRPOConfig>)`` and calls
  ``__call__(completions, **kwargs)``: ``completions`` is one string per generated completion,
  every dataset column arrives as a list aligned with it (plus ``messages``, whose last turn is the
  completion, ``trainer_state``, ...). It returns one float per completion.

Dataset columns read (one row per query):

* ``tenant`` (or ``data_source``): tenant name in config.yaml; may be omitted with one tenant;
* ``ground_truth``: the JSON string of ``qrewrite.reward.ground_truth`` (query, profile, history,
  teacher side), as ``qrewrite rl-data`` writes it, the same record the verl parquet carries;
* or, for a hand-made dataset without it, flat columns made into that record here: ``query_id``;
  ``query`` / ``profile`` / ``history`` (else parsed from the user turn of ``messages`` built by
  ``qrewrite.prompts.user_message``); ``teacher_rewrite``, ``teacher_top1``, ``teacher_mean_top3``,
  ``gold_doc_ids``.

The full component record of the last batch (``formula.REWARD_KEYS``) is kept on the instance as
``last_details``; cumulative counters via ``stats()`` and logged at INFO each batch.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import List

from swift.rewards import ORM, orms

try:
    from qrewrite.reward.adapter import (all_stats, get_scorer, load_reward_config, resolve_config_path,
                                         sample_from_ground_truth)
except ImportError:  # qrewrite not installed in the swift env: use the checkout this file is in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from qrewrite.reward.adapter import (all_stats, get_scorer, load_reward_config, resolve_config_path,
                                         sample_from_ground_truth)
from qrewrite.reward.ground_truth import make_ground_truth
from qrewrite.reward.monitor import get_monitor

log = logging.getLogger("qrewrite.reward.swift_plugin")

REGISTERED_NAME = "qrewrite_reward"

# The user turn written by qrewrite.prompts.user_message (zh and en labels).
_USER_TURN = (
    re.compile(r"\A用户问题：(?P<query>.*?)\n用户画像：(?P<profile>.*?)\n历史摘要：(?P<history>.*)\Z", re.DOTALL),
    re.compile(r"\AQuestion: (?P<query>.*?)\nUser profile: (?P<profile>.*?)\nHistory summary: (?P<history>.*)\Z",
               re.DOTALL),
)
_NONE = {"无", "none", ""}


def split_user_turn(messages) -> tuple[str, str, str]:
    """(query, profile, history) from the last user turn of ``messages``; the whole turn is the query
    when it is not in ``user_message`` format."""
    content = ""
    for m in messages or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = str(m.get("content") or "")
    for pat in _USER_TURN:
        mt = pat.match(content.strip())
        if mt:
            parts = [mt.group(k).strip() for k in ("query", "profile", "history")]
            return parts[0], *("" if p in _NONE else p for p in parts[1:])
    return content.strip(), "", ""


def _col(kwargs: dict, name: str, n: int) -> list:
    v = kwargs.get(name)
    return list(v) if isinstance(v, (list, tuple)) and len(v) == n else [None] * n


FLAT_COLUMNS = ("messages", "query_id", "query", "profile", "history", "teacher_rewrite", "teacher_top1",
                "teacher_mean_top3", "gold_doc_ids")


def _flat_ground_truth(flat: dict[str, list], i: int) -> dict:
    """Row ``i``'s ground truth from the FLAT_COLUMNS (a dataset not written by ``qrewrite rl-data``)."""
    def col(name):
        return flat[name][i]

    query, profile, history = split_user_turn(col("messages"))
    return make_ground_truth({
        "query_id": col("query_id"), "query": query if col("query") is None else col("query"),
        "profile": profile if col("profile") is None else col("profile"),
        "history": history if col("history") is None else col("history"),
        "teacher_rewrite": col("teacher_rewrite"),
        "teacher_retrieval": {"top1": col("teacher_top1"), "mean_top3": col("teacher_mean_top3")},
        "gold_doc_ids": col("gold_doc_ids") or []})


class QrewriteReward(ORM):
    """The qrewrite RL reward (judge + retrieval + win vs the teacher), in [-1, 1]."""

    def __init__(self, args=None, **kwargs):
        super().__init__(args, **kwargs)
        self.config_path = str(resolve_config_path())
        self.last_details: list[dict] = []

    def _default_tenant(self) -> str | None:
        tenants = load_reward_config(self.config_path)["tenants"]
        return tenants[0]["name"] if len(tenants) == 1 else None

    def __call__(self, completions: List[str], **kwargs) -> List[float]:
        n = len(completions)
        tenants = [t or d for t, d in zip(_col(kwargs, "tenant", n), _col(kwargs, "data_source", n))]
        gts = _col(kwargs, "ground_truth", n)
        flat = {k: _col(kwargs, k, n) for k in FLAT_COLUMNS}
        default_tenant = None
        groups: dict[str, list[int]] = {}
        samples = []
        for i in range(n):
            gt = gts[i] if gts[i] is not None else _flat_ground_truth(flat, i)
            samples.append(sample_from_ground_truth(gt, rollout=completions[i]))
            tenant = tenants[i]
            if tenant is None:
                default_tenant = default_tenant or self._default_tenant()
                if default_tenant is None:
                    raise ValueError("qrewrite_reward: dataset has no 'tenant' column and config.yaml has "
                                     "several tenants; add a 'tenant' column")
                tenant = default_tenant
            groups.setdefault(str(tenant), []).append(i)
        details: list[dict | None] = [None] * n
        for tenant, idx in groups.items():
            results = get_scorer(tenant, self.config_path).score_batch([samples[i] for i in idx])
            for i, r in zip(idx, results):
                details[i] = r
        self.last_details = details  # type: ignore[assignment]
        monitor = get_monitor()
        if monitor is not None:  # TensorBoard: reward components per step (qrewrite rl sets the dir)
            state = kwargs.get("trainer_state")
            step = getattr(state, "global_step", None)
            monitor.record(details, self.stats(), step=None if step is None else int(step) + 1)  # type: ignore[arg-type]
        return [float(d["score"]) for d in details]  # type: ignore[index]

    def stats(self) -> dict:
        return all_stats()


orms[REGISTERED_NAME] = QrewriteReward
