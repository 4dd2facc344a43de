"""verl adapter of the qrewrite reward.

Point verl 0.9 at this file::

    reward.custom_reward_function.path=<repo>/qrewrite/reward/verl_reward.py   (or pkg://qrewrite.reward.verl_reward)
    reward.custom_reward_function.name=compute_score
    reward.reward_manager.name=naive

and export ``QREWRITE_CONFIG=/abs/path/config.yaml`` so verl's reward workers (Ray actors) find the
config; ``config_path`` in ``reward.custom_reward_function.reward_kwargs`` works too. Relative paths
in the config are taken relative to the config file's directory.

* ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``: what verl's
  ``naive`` manager calls, per sample, in an executor thread. ``data_source`` is the tenant name,
  ``ground_truth`` the JSON string of ``qrewrite.reward.ground_truth`` (the query with its profile and
  history, which the judge needs, and the teacher side), ``extra_info`` the row's ``{"split", "index",
  "query_id", "tenant"}`` (only ``tenant`` is read). Returns the dict of
  ``qrewrite.reward.formula.REWARD_KEYS``: ``score`` is the reward, every key (numbers only, the
  same for every sample) lands in ``reward_extra_info``.
* ``compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)``: the
  batch signature (legacy ``BatchRewardManager``; handy offline). Scores the batch concurrently.

verl loads this file by path without registering it in ``sys.modules``, so it uses absolute imports
only and keeps its state (one scorer per tenant) in ``qrewrite.reward.adapter``.
"""

from __future__ import annotations

import os
import sys

try:
    from qrewrite.reward.adapter import all_stats, get_scorer, sample_from_ground_truth
except ImportError:  # qrewrite not installed in the training env: use the checkout this file is in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from qrewrite.reward.adapter import all_stats, get_scorer, sample_from_ground_truth
from qrewrite.reward.monitor import get_monitor


def _monitor(details: list[dict]) -> None:
    monitor = get_monitor()  # TensorBoard reward components, when qrewrite rl set $QREWRITE_TB_DIR
    if monitor is not None:
        monitor.record(details, all_stats())


def _tenant(data_source, extra_info: dict) -> str:
    name = extra_info.get("tenant") or data_source
    if isinstance(name, bytes):
        name = name.decode()
    return str(name)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    extra_info = dict(extra_info or {})
    scorer = get_scorer(_tenant(data_source, extra_info), kwargs.get("config_path"))
    details = scorer.score_batch([sample_from_ground_truth(ground_truth, rollout=solution_str)])
    _monitor(details)
    return details[0]


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs) -> list[dict]:
    n = len(solution_strs)
    extra_infos = [dict(e or {}) for e in (extra_infos if extra_infos is not None else [None] * n)]
    out: list[dict | None] = [None] * n
    by_tenant: dict[str, list[int]] = {}
    for i, (ds, ei) in enumerate(zip(data_sources, extra_infos)):
        by_tenant.setdefault(_tenant(ds, ei), []).append(i)
    for tenant, idx in by_tenant.items():
        scorer = get_scorer(tenant, kwargs.get("config_path"))
        results = scorer.score_batch([sample_from_ground_truth(ground_truths[i], rollout=solution_strs[i])
                                      for i in idx])
        for i, r in zip(idx, results):
            out[i] = r
    _monitor(out)  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def reward_stats() -> dict:
    """Cumulative counters (rag_calls, cache hits, judge_calls, failures...) of this process, by tenant."""
    return all_stats()
