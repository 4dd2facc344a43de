"""The reward formula: small pure functions (in the style of verl's ``utils/reward_score/*.py``).

No I/O and no state: the scorer gathers retrieval results and judge scores, these functions turn
them into numbers. Every function is deterministic.
"""

from __future__ import annotations

import math

JUDGE_MIN, JUDGE_MAX = 1.0, 5.0
WIN_BONUS, LOSS_PENALTY = 0.5, -0.3
TANH_SCALE = 3.0

# Every key of ``reward_dict``: verl stacks reward_extra_info per key, so all are always present
# and numeric (no None, no NaN: an absent judge score is 0.0 with judge_sampled = 0).
REWARD_KEYS = ("score", "judge_term", "retrieval_term", "win_term", "rank_term", "rank_rr", "rank_label",
               "judge_sampled", "judge_failed", "judge_student", "judge_teacher", "q_student", "q_teacher",
               "student_top1", "teacher_top1", "win", "red_team", "red_team_passed")
# rank_label: which documents the rank term ranks (0 none, 1 gold, 2 the teacher's top document).
RANK_LABELS = {None: 0, "gold": 1, "teacher": 2}


def judge_term(judge_student: float, judge_teacher: float) -> float:
    """tanh(3 * (judge(student) - judge(teacher)) / 5), judge scores on 1..5; in (-0.98, 0.98)."""
    return math.tanh(TANH_SCALE * (float(judge_student) - float(judge_teacher)) / JUDGE_MAX)


def retrieval_term(q_student: float, q_teacher: float) -> float:
    """tanh(3 * (q_student - q_teacher)); q is in [0, 1] so the difference is in [-1, 1]."""
    return math.tanh(TANH_SCALE * (float(q_student) - float(q_teacher)))


def win(q_student: float, q_teacher: float, epsilon: float = 1e-9) -> int:
    """1 if the student retrieves better than the teacher, -1 if worse, 0 on a tie.

    A tie is |q_student - q_teacher| <= epsilon. The default 1e-9 only absorbs float noise (the
    student reproducing the teacher's rewrite, or a different rewrite retrieving the same documents
    with the same scores, must be a tie, not a coin flip decided by rounding); reranker scores are
    rounded to 1e-6, so any real difference is far larger.
    """
    d = float(q_student) - float(q_teacher)
    if abs(d) <= epsilon:
        return 0
    return 1 if d > 0 else -1


def win_term(outcome: int) -> float:
    """+0.5 for a win, -0.3 for a loss, 0 for a tie."""
    return WIN_BONUS if outcome > 0 else LOSS_PENALTY if outcome < 0 else 0.0


def rank_term(rr: float | None) -> float:
    """2 * RR - 1 for the (tie-aware, expected) reciprocal rank RR of the labelled document among the
    student's hits: +1 at rank 1, 0 at rank 2, -1/3 at rank 3, -1 when not retrieved; 0 with no label.
    Rank-based, in the spirit of ConvSearch-R1's rank reward: it pays for finding the right document,
    not for a confident score."""
    return 0.0 if rr is None else 2.0 * float(rr) - 1.0


def clip(x: float, lo: float = -1.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else float(x)


# reward.formula presets (config schema: reward.formula). faithful: the rank term on the labelled document carries
# most weight (the RL check moved Hit@1 with it); seed: the design's first formula (beat the teacher's score).
FORMULAS = {"faithful": {"judge": 0.2, "retrieval": 0.2, "win": 0.0, "rank": 0.6},
            "seed": {"judge": 0.35, "retrieval": 0.40, "win": 0.25, "rank": 0.0}}


def resolve_weights(formula: str, weights: dict | None) -> dict:
    """The preset's weights, each one given (not null) in `weights` instead."""
    if formula not in FORMULAS:
        raise ValueError(f"reward.formula must be one of {sorted(FORMULAS)}, got {formula!r}")
    return {k: (v if (v := (weights or {}).get(k)) is not None else d) for k, d in FORMULAS[formula].items()}


def total(judge_t: float, retrieval_t: float, win_t: float, weights: dict, rank_t: float = 0.0) -> float:
    """w_judge*judge + w_retrieval*retrieval + w_win*win (+ w_rank*rank), clipped to [-1, 1]."""
    return clip(weights["judge"] * judge_t + weights["retrieval"] * retrieval_t + weights["win"] * win_t
                + weights.get("rank", 0.0) * rank_t)


def reward_dict(*, q_student: float, q_teacher: float, student_top1: float, teacher_top1: float,
                judge_student: float | None, judge_teacher: float | None, weights: dict,
                epsilon: float = 1e-9, judge_failed: bool = False, rank_rr: float | None = None,
                rank_label: str | None = None) -> dict:
    """The full per-sample reward record: ``score`` plus every component (keys: ``REWARD_KEYS``).

    Unsampled judge: a rollout outside the judged share (or whose judge call failed: malformed
    reply, suspected prompt injection, service error) passes ``judge_student=None`` or
    ``judge_teacher=None``. Its judge term is then defined as 0, neutral, and the other weights are
    NOT renormalised:

    * the reward scale stays the same for judged and unjudged rollouts, so GRPO/PPO advantages
      compare like with like (renormalising would inflate the retrieval and win terms by
      1/(1 - w_judge) on exactly the unjudged rollouts);
    * the retrieval and win terms carry the signal for every rollout;
    * an unjudged rollout is neither rewarded nor punished for style, so there is nothing to gain
      from being unjudged (e.g. by making the judge fail).

    ``judge_sampled`` is 1 only when both judge scores are present; ``judge_student`` /
    ``judge_teacher`` are 0.0 when absent (numbers only, never NaN, so verl can stack them).
    """
    sampled = judge_student is not None and judge_teacher is not None
    j_t = judge_term(judge_student, judge_teacher) if sampled else 0.0
    r_t = retrieval_term(q_student, q_teacher)
    outcome = win(q_student, q_teacher, epsilon)
    w_t = win_term(outcome)
    k_t = rank_term(rank_rr)
    return {
        "score": total(j_t, r_t, w_t, weights, k_t),
        "judge_term": float(j_t),
        "retrieval_term": float(r_t),
        "win_term": float(w_t),
        "rank_term": float(k_t),
        "rank_rr": float(rank_rr) if rank_rr is not None else 0.0,
        "rank_label": RANK_LABELS[rank_label if rank_rr is not None else None],
        "judge_sampled": 1 if sampled else 0,
        "judge_failed": 1 if judge_failed else 0,
        "judge_student": float(judge_student) if sampled else 0.0,
        "judge_teacher": float(judge_teacher) if sampled else 0.0,
        "q_student": float(q_student),
        "q_teacher": float(q_teacher),
        "student_top1": float(student_top1),
        "teacher_top1": float(teacher_top1),
        "win": int(outcome),
        "red_team": 0,
        "red_team_passed": 0.0,
    }


def red_team_reward_dict(results: dict[str, bool]) -> dict:
    """The reward record of a red-team rollout (keys: ``REWARD_KEYS``): its score is the checks' reward
    (``qrewrite.data.red_team.reward``: +1 when all pass, else -1 + the share passed), with no teacher, retrieval or
    judge term (an adversarial row has no teacher rewrite to compare with); ``red_team_passed`` is the share of
    its checks passed. The other components are 0 so verl can stack the keys."""
    from ..data.red_team import reward

    record = {k: 0.0 for k in REWARD_KEYS}
    record.update(score=float(reward(results)), rank_label=0, judge_sampled=0, judge_failed=0, win=0, red_team=1,
                  red_team_passed=sum(results.values()) / len(results))
    return record
