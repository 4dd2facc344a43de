"""What both training-framework adapters call: the verl reward function (``verl_reward.py``) and the
ms-swift plugin (``swift_plugin.py``) run inside another framework's process, so they find the config
themselves, keep one ``RewardScorer`` per tenant for the life of that process, and turn the framework's
ground-truth column into a ``RewardSample``. The scoring itself is ``scorer.py``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from . import reward_settings
from .ground_truth import parse_ground_truth
from .scorer import RewardSample, RewardScorer, clean_rollout


CONFIG_ENV = "QREWRITE_CONFIG"
PROJECT_ROOT_ENV = "QREWRITE_PROJECT_ROOT"  # relative paths in the config are relative to it (default: its dir)
_REPO_ROOT = Path(__file__).resolve().parents[2]
_SCORERS: dict[tuple[str, str], RewardScorer] = {}
_SCORERS_LOCK = threading.Lock()


def resolve_config_path(config_path: str | os.PathLike | None = None) -> Path:
    """``config_path``, else ``$QREWRITE_CONFIG``, else ./config.yaml, else the repo's config.yaml."""
    p = config_path or os.environ.get(CONFIG_ENV)
    if p:
        return Path(p).expanduser().resolve()
    here = Path("config.yaml")
    return here.resolve() if here.exists() else _REPO_ROOT / "config.yaml"


def load_reward_config(config_path: str | os.PathLike | None = None) -> dict:
    """Validated config with relative paths (tenants' kb.path, reward.cache_dir) made absolute
    against ``$QREWRITE_PROJECT_ROOT``, else the config file's directory: training workers (Ray actors,
    launchers) may run elsewhere."""
    from ..config import load_config

    path = resolve_config_path(config_path)
    cfg = load_config(path)
    # `qrewrite rl` passes the project root (where Snakemake/DVC run), as the resolved config lives in results/
    base = Path(os.environ.get(PROJECT_ROOT_ENV) or path.parent)

    def rebase(p: str) -> str:
        return p if os.path.isabs(p) else str(base / p)

    for t in cfg["tenants"]:
        t["kb"]["path"] = rebase(t["kb"]["path"])
    cfg["reward"] = dict(cfg.get("reward") or {})
    cfg["reward"]["cache_dir"] = rebase(reward_settings(cfg)["cache_dir"])
    return cfg


def get_scorer(tenant_name: str, config_path: str | os.PathLike | None = None) -> RewardScorer:
    """One scorer per (config file, tenant) per process, built on first use."""
    from ..config import tenant_config

    key = (str(resolve_config_path(config_path)), tenant_name)
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            cfg = load_reward_config(key[0])
            scorer = _SCORERS[key] = RewardScorer(cfg, tenant_config(cfg, tenant_name))
        return scorer


def all_stats() -> dict:
    """Counters of every scorer in this process, by tenant."""
    return {tenant: s.stats() for (_, tenant), s in _SCORERS.items()}


def _num(x) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def sample_from_ground_truth(ground_truth, *, rollout: str) -> RewardSample:
    """A ``RewardSample`` from the RL ground truth (``qrewrite.reward.ground_truth``: a JSON string or
    dict with the query, its profile and history, the teacher side) and the rollout text (cleaned here)."""
    gt = parse_ground_truth(ground_truth)
    tr = gt.get("teacher_retrieval") or {}
    query = str(gt["query"])
    qid = str(gt["query_id"]) if gt["query_id"] not in (None, "") else \
        "q-" + hashlib.sha256(query.encode()).hexdigest()[:16]
    hits = tr.get("hits")
    return RewardSample(
        query_id=qid, query=query, rollout=clean_rollout(rollout),
        teacher_rewrite=gt.get("teacher_rewrite"), teacher_top1=_num(tr.get("top1")),
        teacher_mean_top3=_num(tr.get("mean_top3")), teacher_hits=hits if isinstance(hits, list) else None,
        gold_doc_ids=[str(d) for d in gt.get("gold_doc_ids") or []],
        profile=str(gt["profile"] or ""), history=str(gt["history"] or ""), red_team=gt.get("red_team") or None)
