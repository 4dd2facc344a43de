"""Summary of an RL run from the reward monitor's curve (`reward_curve.jsonl` next to the TensorBoard events)."""

from __future__ import annotations

from pathlib import Path

from ...errors import QrewriteError
from ...io_utils import read_jsonl
from ...reward.monitor import CURVE_FILE

KEYS = ("reward_mean", "win_rate", "tie_rate", "loss_rate", "student_top1", "teacher_top1", "judge_term",
        "retrieval_term", "win_term")


def _mean(rows: list[dict], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 4)


def reward_trend(values: list[float]) -> dict:
    """Did the reward rise beyond its noise? The last third's mean minus the first third's, against twice the
    standard error of that difference (from the per-step spread within each third). Fewer than 2 steps per
    third: no verdict (None), since one step's reward is as noisy as a rise."""
    k = len(values) // 3
    out = {"steps": len(values), "window": k, "rise": None, "se": None, "rose_beyond_noise": None}
    if k < 1:
        return out
    first, last = values[:k], values[-k:]
    rise = sum(last) / k - sum(first) / k
    out["rise"] = round(rise, 4)
    if k < 2:
        return out

    def var(xs):
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)

    se = ((var(first) + var(last)) / k) ** 0.5
    out.update(se=round(se, 4), rose_beyond_noise=bool(rise > 2 * se))
    return out


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
        "trend": reward_trend([float(r["reward_mean"]) for r in rows]),
        "rag_calls": int(last["rag_calls"]),
        "judge_calls": int(last["judge_calls"]),
        "rag_cache_hit_rate": round(last["rag_cache_hit_rate"], 4),
        "judge_cache_hit_rate": round(last["judge_cache_hit_rate"], 4),
    }
