"""The distilled judge's two GRPO rewards, pure functions of a completion (in the spirit of verl's
utils/reward_score): the format (one JSON reply that parses, with a reason and a 1-5 score) and the verdict (its
score on the right side of GOOD_AT for the item's label)."""

from __future__ import annotations

from ..reward.judge_prompt import read_reply, verdict


def format_reward(completion: str) -> float:
    """1 for a reply the judge's parser reads, with a non-empty reason; else 0."""
    parsed = read_reply(completion)
    return 1.0 if parsed is not None and parsed[1].strip() else 0.0


def verdict_reward(completion: str, label: str) -> float:
    """+1 when the reply's verdict matches `label` (good | bad), -1 when it contradicts it, -1 when it does not
    parse (no verdict is a wrong verdict)."""
    parsed = read_reply(completion)
    if parsed is None:
        return -1.0
    return 1.0 if verdict(parsed[0]) == label else -1.0
