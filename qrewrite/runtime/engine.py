"""One model's requests batched: the serving engine of an in-process release.

Requests wait in a bounded queue; one worker thread per model takes every waiting request (up to `max_batch`)
and generates them together (`LocalRewriter.rewrite`, one padded batch that reuses the prompts' shared prefix).
There is no artificial delay: a request that finds the worker idle starts at once, alone, exactly as the eval's
release row was generated; requests that arrive while a batch runs form the next batch. A tenant's backlog is its
own: each model has its own queue and worker.

Admission is answered at once, never by a timeout: `submit` raises `Overloaded` (the gateway's 429 with
Retry-After) when `max_queued` requests already wait, or when the batches ahead of a new request would take
longer than its deadline at the measured batch time. A request whose caller goes away before its batch starts is
dropped from the queue (`concurrent.futures.Future.cancel`); one already generating finishes for nobody (a forward
pass cannot be stopped half-way). `close(drain_s)` refuses new requests, lets the queue finish for at most
`drain_s`, then fails what is left.

A request in a batch is the computation it is alone up to masked padding and the batch's shape: the tenant's prompt
start is computed once and shared (`LocalRewriter.fix_prefix`). That is no guarantee of the same greedy token at a
near tie, so the deploy check compares the texts at every concurrency level. `max_batch: 1` serves every request
alone.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """The model's queue is full, or the wait would pass the request's deadline: refused at once (429)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Closed(Exception):
    """The engine is draining or closed (the gateway is shutting down, or the release was swapped out)."""


@dataclass
class _Job:
    row: dict
    future: concurrent.futures.Future
    queued_at: float = field(default_factory=time.monotonic)


class BatchingEngine:
    """`submit(row, deadline_s)` → a Future of the generation dict (`LocalRewriter.rewrite`'s row, plus
    `batch_size` and `queue_s`). `generate` is a callable rows → results (one result per row, in order)."""

    def __init__(self, generate, *, name: str, max_batch: int, max_queued: int):
        self._generate, self.name = generate, name
        self.max_batch, self.max_queued = max(1, int(max_batch)), max(0, int(max_queued))
        self._cv = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._closed = False
        self._busy = False
        # seconds per batch, by batch size: the admission estimate (None until a batch of that size ran)
        self._batch_s: dict[int, float] = {}
        self.stats = {"requests": 0, "batches": 0, "refused": 0, "cancelled": 0, "failed": 0, "max_batch_seen": 0}
        self._thread = threading.Thread(target=self._loop, name=f"qrewrite-engine-{name}", daemon=True)
        self._thread.start()

    # ---- admission --------------------------------------------------------------------------------------------
    def _estimate_s(self, ahead: int) -> float | None:
        """Seconds until a request with `ahead` requests before it would be answered: the running batch, the full
        batches ahead, then its own; None before any batch has been timed."""
        if not self._batch_s:
            return None
        per = max(self._batch_s.values())  # the slowest batch size seen: refuse early rather than time out
        batches = (1 if self._busy else 0) + ahead // self.max_batch + 1
        return batches * per

    def submit(self, row: dict, deadline_s: float | None = None) -> concurrent.futures.Future:
        with self._cv:
            if self._closed:
                raise Closed(f"{self.name}: the model is shutting down")
            ahead = len(self._waiting)
            wait = self._estimate_s(ahead)
            if ahead >= self.max_queued or (deadline_s is not None and wait is not None and wait > deadline_s):
                self.stats["refused"] += 1
                retry = max(1, math.ceil(wait if wait is not None else 1.0))
                why = (f"{ahead} requests already wait (serve.engine.max_queued {self.max_queued})"
                       if ahead >= self.max_queued else
                       f"the {ahead} requests ahead would take about {wait:.1f} s, past the {deadline_s:g} s timeout")
                raise Overloaded(f"{self.name} is at capacity: {why}", retry)
            job = _Job(row, concurrent.futures.Future())
            self._waiting.append(job)
            self.stats["requests"] += 1
            self._cv.notify()
            return job.future

    def alive(self) -> bool:
        with self._cv:
            return not self._closed and self._thread.is_alive()

    def queued(self) -> int:
        with self._cv:
            return len(self._waiting)

    # ---- the worker -------------------------------------------------------------------------------------------
    def _take(self) -> list[_Job] | None:
        with self._cv:
            while not self._waiting and not self._closed:
                self._cv.wait()
            if not self._waiting:
                return None
            jobs = []
            while self._waiting and len(jobs) < self.max_batch:
                job = self._waiting.popleft()
                if job.future.set_running_or_notify_cancel():  # False: its caller went away while it waited
                    jobs.append(job)
                else:
                    self.stats["cancelled"] += 1
            self._busy = bool(jobs)
            return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            if not jobs:
                continue
            start = time.monotonic()
            try:
                results = self._generate([j.row for j in jobs])
            except BaseException as exc:  # noqa: BLE001 - each waiting request gets the error, the worker goes on
                with self._cv:
                    self.stats["failed"] += len(jobs)
                    self._busy = False
                for j in jobs:
                    j.future.set_exception(exc)
                continue
            wall = time.monotonic() - start
            with self._cv:
                n = len(jobs)
                prev = self._batch_s.get(n)
                self._batch_s[n] = wall if prev is None else 0.7 * prev + 0.3 * wall
                self.stats["batches"] += 1
                self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], n)
                self._busy = False
            for j, res in zip(jobs, results):
                j.future.set_result({**res, "batch_size": n, "queue_s": round(start - j.queued_at, 6)})

    # ---- shutdown ---------------------------------------------------------------------------------------------
    def close(self, drain_s: float = 0.0) -> None:
        """Refuse new requests; let the waiting ones finish for at most `drain_s`, then fail the rest."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=max(0.0, drain_s))
        with self._cv:
            left = list(self._waiting)
            self._waiting.clear()
        for j in left:
            if j.future.set_running_or_notify_cancel():
                j.future.set_exception(Closed(f"{self.name}: shut down before this request's batch started"))

    def describe(self) -> dict:
        with self._cv:
            return {"max_batch": self.max_batch, "max_queued": self.max_queued, "queued": len(self._waiting),
                    "busy": self._busy, **self.stats,
                    "batch_s": {str(k): round(v, 4) for k, v in sorted(self._batch_s.items())}}
