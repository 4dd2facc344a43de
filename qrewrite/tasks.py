"""Running a stage's calls concurrently: results as they complete, a progress bar, nothing left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable

from tqdm import tqdm


async def gather_with_progress(coros: Iterable[Awaitable], *, desc: str, progress: bool) -> list:
    """Await every coroutine concurrently; results in completion order. The first exception propagates; the
    other tasks are then cancelled and awaited, so none keeps running and no task's exception goes unretrieved
    (asyncio would print it, with a traceback, when the task is garbage-collected)."""
    tasks = [asyncio.create_task(c) for c in coros]
    out = []
    try:
        bar = tqdm(total=len(tasks), desc=desc, unit="q", disable=not progress, mininterval=0.5)
        for fut in asyncio.as_completed(tasks):
            out.append(await fut)
            bar.update(1)
        bar.close()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out
