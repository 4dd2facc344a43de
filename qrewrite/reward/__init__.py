"""The RL reward: one core (``formula`` + ``judge`` + ``scorer``), two adapters (verl, ms-swift).

Reward for a student rewrite of query x, against the precomputed teacher rewrite of x:

    judge_term     = tanh(3 * (judge(student) - judge(teacher)) / 5)      judge scores on 1..5
    retrieval_term = tanh(3 * (q_student - q_teacher))                    q: rag.quality (top hit's score)
    win_term       = +0.5 if q_student > q_teacher, -0.3 if lower, 0 on a tie (|diff| <= epsilon)
    rank_term      = 2 * RR - 1, RR the reciprocal rank of the label (gold, else the teacher's top document)
    score          = clip(w_judge*judge_term + w_retrieval*retrieval_term + w_win*win_term
                          + w_rank*rank_term, -1, 1)          w_rank = 0 by default: the seed formula

Settings live under ``reward:`` in config.yaml; ``DEFAULTS`` below is merged under
``cfg.get("reward", {})`` by ``reward_settings`` so the code works with or without the schema section.
"""

from __future__ import annotations

import copy
from typing import Any

# The embedded rule judge's version, recorded in lineage (qrewrite.reward.judge.RuleJudge.model).
RULE_JUDGE_MODEL = "rules-v2"

DEFAULTS: dict[str, Any] = {
    "weights": {"judge": 0.35, "retrieval": 0.40, "win": 0.25, "rank": 0.0},
    # Rank term (weight `weights.rank`, 0 = the seed formula): which documents the student's hits are ranked
    # against. auto = the gold documents where the query has them, else the teacher's top document.
    "rank_label": "auto",
    # q_student and q_teacher closer than this count as a tie (no win/loss bonus).
    "epsilon": 1e-9,
    "cache_dir": "cache/reward",
    "judge": {
        "provider": "rule",        # rule (embedded, deterministic) | openai (any OpenAI-compatible API)
        "sample_share": 0.3,       # share of rollouts judged; picked by a hash of (query id, rollout text)
        "rule": {"max_term_df": 0.2},
        "openai": {
            "base_url": None,
            "model": "gpt-5",
            "api_key_env": "OPENAI_API_KEY",
            "temperature": 0.0,
            "max_tokens": 200,
            "timeout_s": 60,
            "max_retries": 3,
            "backoff_base_s": 1.0,
            "backoff_max_s": 30.0,
            "concurrency": 8,
        },
    },
}


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def reward_settings(cfg: dict) -> dict:
    """``DEFAULTS`` deep-merged with ``cfg["reward"]`` (absent or partial sections are fine)."""
    return _deep_merge(DEFAULTS, (cfg or {}).get("reward") or {})
