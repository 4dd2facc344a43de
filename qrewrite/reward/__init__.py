"""The RL reward: one core (``formula`` + a judge + ``scorer``), two adapters (verl, ms-swift).

Modules: ``formula`` (the reward from its terms); ``judges`` (the judge ``reward.judge.provider`` names:
``judge_rules.RuleJudge`` or ``judge_openai.OpenAIJudge``), ``verdict`` (their answer, which rollouts are
judged); ``scorer`` (rollouts in, reward records out); ``verl_reward`` and ``swift_plugin`` (the adapters,
loaded by file path) with ``adapter`` (what both call) and ``ground_truth`` (the record they read);
``monitor`` (TensorBoard).

Reward for a student rewrite of query x, against the precomputed teacher rewrite of x:

    judge_term     = tanh(3 * (judge(student) - judge(teacher)) / 5)      judge scores on 1..5, each graded
                                                                          against the teacher's rewrite
    retrieval_term = tanh(3 * (q_student - q_teacher))                    q: rag.quality (top hit's score)
    win_term       = +0.5 if q_student > q_teacher, -0.3 if lower, 0 on a tie (|diff| <= epsilon)
    rank_term      = 2 * RR - 1, RR the reciprocal rank of the label (gold, else the teacher's top document)
    score          = clip(w_judge*judge_term + w_retrieval*retrieval_term + w_win*win_term
                          + w_rank*rank_term, -1, 1)

    weights: reward.formula's preset (faithful by default; seed: the design's first formula), each one set under
    reward.weights instead

Settings live under ``reward:`` in config.yaml; their defaults live in the config schema only.
``reward_defaults()`` (read from it) is merged under ``cfg.get("reward", {})`` by ``reward_settings``, for
callers that hold a partial or unvalidated config (the reward plugins inside the training frameworks).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

# The embedded rule judge's version, recorded in lineage (qrewrite.reward.judge_rules.RuleJudge.model).
RULE_JUDGE_MODEL = "rules-v3"


def _schema_defaults(node: dict) -> Any:
    """What validation fills in for `node`: a leaf's default; an object's properties that have one."""
    if node.get("type") == "object" and "properties" in node:
        return {k: _schema_defaults(v) for k, v in node["properties"].items()
                if "default" in v or (v.get("type") == "object" and "properties" in v)}
    return copy.deepcopy(node["default"])


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    # Read on first use, not at import: lineage and every reward worker import this package.
    from ..config import load_schema

    return _schema_defaults(load_schema()["properties"]["reward"])


def reward_defaults() -> dict[str, Any]:
    """The reward settings a config without a reward: section gets, read from the schema (their one home,
    with their descriptions): weights, rank_label, epsilon, cache_dir, judge.{provider, sample_share, rule,
    openai}. A fresh copy."""
    return copy.deepcopy(_defaults())


def reward_settings(cfg: dict) -> dict:
    """``reward_defaults()`` deep-merged with ``cfg["reward"]`` (absent or partial sections are fine), the
    weights resolved from ``reward.formula``."""
    from ..config import deep_merge
    from .formula import resolve_weights

    s = deep_merge(_defaults(), (cfg or {}).get("reward") or {})
    s["weights"] = resolve_weights(s.get("formula", "faithful"), s.get("weights"))
    return s
