"""The serving engine (qrewrite.runtime.engine) on its own: batching, admission, cancellation, drain. Its generate
function here is a test stand-in that records the batches it is given and takes a fixed time per batch; the
engine's queue, worker thread and futures are the real ones."""

from __future__ import annotations

import threading
import time

import pytest

from qrewrite.runtime.engine import BatchingEngine, Closed, Overloaded


class Recorder:
    """rows → one result per row, after `batch_s`; remembers each batch's queries. `gate` holds a batch until set."""

    def __init__(self, batch_s: float = 0.05, gate: threading.Event | None = None):
        self.batch_s, self.gate, self.batches = batch_s, gate, []

    def __call__(self, rows):
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(self.batch_s)
        self.batches.append([r["query"] for r in rows])
        return [{"rewrite": r["query"].upper()} for r in rows]


def test_a_request_that_finds_the_engine_idle_runs_alone_and_the_rest_are_batched():
    gate = threading.Event()
    gen = Recorder(gate=gate)
    eng = BatchingEngine(gen, name="t", max_batch=4, max_queued=16)
    try:
        first = eng.submit({"query": "a"})
        time.sleep(0.1)  # the worker took "a" alone and waits on the gate
        rest = [eng.submit({"query": q}) for q in "bcdefg"]
        gate.set()
        assert first.result(5)["rewrite"] == "A" and first.result()["batch_size"] == 1
        got = [f.result(5) for f in rest]
        assert [g["rewrite"] for g in got] == list("BCDEFG")
        assert gen.batches == [["a"], ["b", "c", "d", "e"], ["f", "g"]]
        assert [g["batch_size"] for g in got] == [4, 4, 4, 4, 2, 2]
    finally:
        eng.close(5)


def test_past_capacity_a_request_is_refused_at_once_with_a_retry_after():
    gate = threading.Event()
    eng = BatchingEngine(Recorder(gate=gate), name="t", max_batch=2, max_queued=3)
    try:
        eng.submit({"query": "running"})
        time.sleep(0.1)
        queued = [eng.submit({"query": str(i)}) for i in range(3)]
        start = time.monotonic()
        with pytest.raises(Overloaded) as exc:
            eng.submit({"query": "one too many"})
        assert time.monotonic() - start < 0.1 and exc.value.retry_after_s >= 1
        assert "max_queued 3" in str(exc.value)
        gate.set()
        assert [f.result(5)["rewrite"] for f in queued] == ["0", "1", "2"]
        assert eng.describe()["refused"] == 1
    finally:
        eng.close(5)


def test_a_request_whose_wait_would_pass_its_deadline_is_refused_not_held():
    eng = BatchingEngine(Recorder(batch_s=0.3), name="t", max_batch=1, max_queued=100)
    try:
        eng.submit({"query": "timed"}).result(5)  # one batch measured: 0.3 s
        eng.submit({"query": "busy"})
        for i in range(3):
            eng.submit({"query": str(i)}, deadline_s=10)
        with pytest.raises(Overloaded) as exc:  # 1 running + 3 ahead + its own: about 1.5 s, past 1 s
            eng.submit({"query": "late"}, deadline_s=1.0)
        assert "past the 1 s timeout" in str(exc.value)
    finally:
        eng.close(5)


def test_a_cancelled_request_is_dropped_from_the_queue():
    gate = threading.Event()
    gen = Recorder(gate=gate)
    eng = BatchingEngine(gen, name="t", max_batch=8, max_queued=8)
    try:
        eng.submit({"query": "running"})
        time.sleep(0.1)
        gone, kept = eng.submit({"query": "gone"}), eng.submit({"query": "kept"})
        assert gone.cancel()
        gate.set()
        assert kept.result(5)["rewrite"] == "KEPT"
        assert gen.batches == [["running"], ["kept"]] and eng.describe()["cancelled"] == 1
    finally:
        eng.close(5)


def test_close_drains_within_its_bound_and_refuses_new_requests():
    eng = BatchingEngine(Recorder(batch_s=0.2), name="t", max_batch=1, max_queued=50)
    futures = [eng.submit({"query": str(i)}) for i in range(20)]  # 20 x 0.2 s: more than the drain allows
    start = time.monotonic()
    eng.close(drain_s=0.5)
    assert time.monotonic() - start < 2.0
    with pytest.raises(Closed):
        eng.submit({"query": "after"})
    done = [f for f in futures if f.done() and f.exception() is None]
    failed = [f for f in futures if f.done() and isinstance(f.exception(), Closed)]
    assert 1 <= len(done) < 20 and len(done) + len(failed) + sum(not f.done() for f in futures) == 20
    assert failed, "what the drain left must be failed, not left waiting"


def test_a_failing_batch_fails_its_requests_and_the_engine_goes_on():
    calls = []

    def gen(rows):
        calls.append(len(rows))
        if any(r["query"] == "boom" for r in rows):
            raise RuntimeError("the model failed")
        return [{"rewrite": r["query"]} for r in rows]

    eng = BatchingEngine(gen, name="t", max_batch=1, max_queued=4)
    try:
        with pytest.raises(RuntimeError):
            eng.submit({"query": "boom"}).result(5)
        assert eng.submit({"query": "fine"}).result(5)["rewrite"] == "fine" and eng.alive()
    finally:
        eng.close(1)
