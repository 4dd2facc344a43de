"""What the scorer and eval see of any judge: its answer (``Verdict``) and which rollouts get one.

Which rollouts are judged is ``judge_sampled(query_id, rollout_text, share)``: a hash, so reruns judge the
same rollouts and hit the judge cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """A judge's answer. ``score`` is None when the judge failed (``reason`` says why)."""

    score: float | None
    reason: str
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.score is not None


def judge_sampled(query_id: str, text: str, share: float) -> bool:
    """Deterministic sampling: judge this rollout iff hash(query_id, text) falls below ``share``."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    digest = hashlib.sha256(f"{query_id}\x1f{text}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < share
