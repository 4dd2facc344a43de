"""Exponential backoff that honours Retry-After, shared by the teacher and RAG clients."""

from __future__ import annotations

import email.utils
import random
import time


def retry_after_seconds(headers) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), or None."""
    if headers is None:
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None) -> float:
    """Delay before retry number `attempt` (0-based): server's Retry-After wins, else full-jitter exponential."""
    if retry_after is not None:
        return retry_after
    return random.uniform(0, min(cap, base * (2 ** attempt)))
