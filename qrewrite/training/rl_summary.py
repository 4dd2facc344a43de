"""Summary of an RL run from the reward monitor's curve (`reward_curve.jsonl` next to the TensorBoard events)."""

from __future__ import annotations

from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_jsonl
from ..reward.monitor import CURVE_FILE

KEYS = ("reward_mean", "win_rate", "tie_rate", "loss_rate", "student_top1", "teacher_top1", "judge_term",
        "retrieval_term", "win_term")


def _mean(rows: list[dict], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 4)


def summarize_curve(tb_dir: str | Path) -> dict:
    path = Path(tb_dir) / CURVE_FILE
    if not path.is_file():
        raise QrewriteError(f"no reward curve at {path}: the reward plugin never ran",
                            hint="check the training log: was --external_plugins loaded and QREWRITE_TB_DIR set?")
    rows = read_jsonl(path)
    if not rows:
        raise QrewriteError(f"empty reward curve {path}")
    k = max(1, len(rows) // 3)  # first and last third: the trend without single-step noise
    last = rows[-1]
    return {
        "reward_steps": len(rows),
        "rollouts_scored": sum(int(r["n"]) for r in rows),
        "first": {key: _mean(rows[:k], key) for key in KEYS},
        "last": {key: _mean(rows[-k:], key) for key in KEYS},
        "rag_calls": int(last["rag_calls"]),
        "judge_calls": int(last["judge_calls"]),
        "rag_cache_hit_rate": round(last["rag_cache_hit_rate"], 4),
        "judge_cache_hit_rate": round(last["judge_cache_hit_rate"], 4),
    }
