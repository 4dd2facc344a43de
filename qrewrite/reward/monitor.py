"""TensorBoard scalars of the reward during RL, written next to the backend's own logs.

The backends log their losses (ms-swift GRPO: ``train/loss``, ``train/reward``, clip ratios; verl:
``actor/pg_loss``, ``critic/vf_loss``, ``actor/pg_clipfrac``) but not what the reward is made of.
Both reward adapters feed every scored batch to ``record``; the monitor writes, per flush:

* ``qrewrite/reward_mean`` and the mean of each term (``qrewrite/judge_term`` ...);
* ``qrewrite/win_rate`` / ``tie_rate`` / ``loss_rate`` against the teacher;
* ``qrewrite/student_top1`` / ``teacher_top1`` (mean reranker top1), ``qrewrite/judge_sampled_share``;
* cumulative counters: ``qrewrite/rag_calls``, ``qrewrite/judge_calls``, ``qrewrite/rag_cache_hit_rate``,
  ``qrewrite/judge_cache_hit_rate``.

Enabled by ``$QREWRITE_TB_DIR`` (set by ``qrewrite rl``); a no-op otherwise, so the adapters work the
same outside the pipeline. ms-swift calls the reward once per generation batch, which is one flush
(step = the trainer's global step). verl calls it once per rollout, so the monitor flushes every
``$QREWRITE_TB_FLUSH_EVERY`` rollouts (``qrewrite rl`` sets it to prompts x rollouts per step).
A JSONL twin (``reward_curve.jsonl`` in the same folder, or ``$QREWRITE_CURVE_FILE``) holds the same numbers for
the report; ``qrewrite rl`` keeps it in the run folder, which outlives an interrupted job, so a resumed run's
curve still starts at step 1.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict

TB_DIR_ENV = "QREWRITE_TB_DIR"
FLUSH_EVERY_ENV = "QREWRITE_TB_FLUSH_EVERY"
TERMS = ("score", "judge_term", "retrieval_term", "win_term", "student_top1", "teacher_top1", "q_student",
         "q_teacher", "judge_sampled")
CURVE_FILE = "reward_curve.jsonl"
CURVE_ENV = "QREWRITE_CURVE_FILE"
STEP_OFFSET_ENV = "QREWRITE_TB_STEP_OFFSET"  # verl resumed at step N counts its flushes from N + 1


def batch_scalars(details: list[dict]) -> dict[str, float]:
    """Means of one batch of reward records (``qrewrite.reward.formula.REWARD_KEYS``)."""
    n = len(details)
    if not n:
        return {}
    out = {("reward_mean" if k == "score" else k): sum(float(d[k]) for d in details) / n for k in TERMS}
    out["judge_sampled_share"] = out.pop("judge_sampled")
    out["rank_term"] = sum(float(d.get("rank_term", 0.0)) for d in details) / n  # 0 unless weights.rank > 0
    wins = [int(d["win"]) for d in details]
    out["win_rate"] = sum(w > 0 for w in wins) / n
    out["tie_rate"] = sum(w == 0 for w in wins) / n
    out["loss_rate"] = sum(w < 0 for w in wins) / n
    return out


def counter_scalars(stats: dict) -> dict[str, float]:
    """Cumulative call counters summed over tenants (``qrewrite.reward.adapter.all_stats``)."""
    tot: dict[str, float] = defaultdict(float)
    for s in stats.values():
        for k, v in s.items():
            if isinstance(v, (int, float)):
                tot[k] += v
    rag_hits = tot["rag_cache_hits"] + tot["rag_disk_hits"]
    judge_hits = tot["judge_cache_hits"] + tot["judge_memo_hits"]
    return {
        "rag_calls": tot["rag_calls"],
        "judge_calls": tot["judge_calls"],
        "rag_cache_hit_rate": rag_hits / (rag_hits + tot["rag_calls"]) if rag_hits + tot["rag_calls"] else 0.0,
        "judge_cache_hit_rate": (judge_hits / (judge_hits + tot["judge_calls"])
                                 if judge_hits + tot["judge_calls"] else 0.0),
    }


class RewardMonitor:
    def __init__(self, log_dir: str, flush_every: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # both training envs have tensorboard

        os.makedirs(log_dir, exist_ok=True)
        self.writer = SummaryWriter(log_dir=log_dir, filename_suffix=".qrewrite")
        self.curve = os.environ.get(CURVE_ENV) or os.path.join(log_dir, CURVE_FILE)
        self.flush_every = flush_every
        self.pending: list[dict] = []
        self.flushes = int(os.environ.get(STEP_OFFSET_ENV) or 0)
        self.lock = threading.Lock()

    def record(self, details: list[dict], stats: dict, step: int | None = None) -> None:
        with self.lock:
            self.pending.extend(details)
            if self.flush_every and len(self.pending) < self.flush_every and step is None:
                return
            self._flush(stats, step)

    def _flush(self, stats: dict, step: int | None) -> None:
        scalars = {**batch_scalars(self.pending), **counter_scalars(stats)}
        self.flushes += 1
        step = self.flushes if step is None else step
        for k, v in scalars.items():
            self.writer.add_scalar(f"qrewrite/{k}", v, step)
        self.writer.flush()
        with open(self.curve, "a", encoding="utf-8") as fh:  # append-only log, one line per flush
            fh.write(json.dumps({"step": step, "n": len(self.pending), **scalars}) + "\n")
        self.pending = []


_MONITOR: RewardMonitor | None = None
_LOCK = threading.Lock()


def get_monitor() -> RewardMonitor | None:
    """The process's monitor if ``$QREWRITE_TB_DIR`` is set, else None."""
    global _MONITOR
    log_dir = os.environ.get(TB_DIR_ENV)
    if not log_dir:
        return None
    with _LOCK:
        if _MONITOR is None:
            _MONITOR = RewardMonitor(log_dir, int(os.environ.get(FLUSH_EVERY_ENV) or 0))
        return _MONITOR
