"""Fault injection against real servers on loopback.

* The teacher stage against tests/fake_openai_server.py (TEST FAKE) told to answer 429 + Retry-After,
  500, 503, a timeout, a connection reset, a malformed JSON body, empty choices or a truncated body;
  the OpenAI judge against the same faults.
* The validation stage (HTTP RAG provider) against tests/fault_rag_server.py: the real RAG app behind
  a TEST-ONLY wrapper told to fail or to slow down.
* Services that stay down: the stage fails naming the service and what to do, and writes nothing.
* kill -9 at seeded random points, >= 20 times across the teacher and validation stages: every rerun
  completes, repeats no call whose answer reached the cache, and leaves the cache readable; and
  Snakemake itself killed mid-run never takes a half-written file as done.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from conftest import REPO, TESTS, FakeOpenAI, Project, free_port, start_server, stop
from qrewrite.paths import tenant_paths

ENV = {"QR_TEST_KEY": "sk-test-not-a-real-key"}
PATHS = tenant_paths("fivedoctors")
TEACH_ARGV = ["teacher", "--config", "config.yaml", "--tenant", "fivedoctors", "--queries", PATHS["queries"],
              "--out", PATHS["teacher"], "--stats", PATHS["stats_teacher"], "--no-progress"]
VALIDATE_ARGV = ["validate", "--config", "config.yaml", "--tenant", "fivedoctors", "--queries", PATHS["queries"],
                 "--teacher", PATHS["teacher"], "--out", PATHS["validated"], "--stats", PATHS["stats_validate"], "--no-progress"]
TEACHER_FAULTS = [429, 500, 503, "timeout", "reset", "malformed_json", "empty_choices", "truncated"]


# ------------------------------------------------------------------------------------------- helpers

def clone(template: Project, dst: Path) -> Project:
    """A copy of a prepared scratch project (saves rebuilding the Excel and ingesting per test)."""
    shutil.copytree(template.root, dst)
    p = object.__new__(Project)
    p.root, p.config_path = dst, dst / "config.yaml"
    return p


def keep_unique_queries(project: Project, n: int, tenant: str = "fivedoctors") -> None:
    """Trim the demo source to its first n rows with distinct question text: two rows with one question
    send the RAG service the same raw-query search twice in one run, which would blur call counting."""
    src = project.root / "data" / "demo" / f"{tenant}.queries.jsonl"
    seen, keep = set(), []
    for line in src.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)["query"]
        if q not in seen and len(keep) < n:
            seen.add(q)
            keep.append(line)
    src.write_text("\n".join(keep) + "\n", encoding="utf-8")


def use_openai_teacher(project: Project, url: str, concurrency: int = 3, **openai_cfg) -> None:
    project.update(teacher={"provider": "openai", "concurrency": concurrency,
                            "openai": {"base_url": url, "model": "test-model", "api_key_env": "QR_TEST_KEY",
                                       "backoff_base_s": 0.0, "timeout_s": 5, **openai_cfg}})


def use_http_rag(project: Project, url: str, concurrency: int = 4, **http_cfg) -> None:
    project.update(rag={"provider": "http", "concurrency": concurrency,
                        "http": {"base_url": url, "max_retries": 2, "backoff_base_s": 0.0, **http_cfg}})


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout}s")


def cache_entries(cache_dir: Path) -> list[Path]:
    return [f for f in cache_dir.rglob("*.json") if not f.name.startswith(".")] if cache_dir.exists() else []


def assert_cache_intact(cache_dir: Path) -> int:
    """Every entry parses; the only other files are orphaned temp files of a write the kill cut short
    (`.<key>.json.*.tmp`, never renamed into place, so no reader ever opens them)."""
    n = 0
    for f in cache_dir.rglob("*"):
        if not f.is_file():
            continue
        if f.name.startswith("."):
            assert f.name.endswith(".tmp"), f
        else:
            assert f.suffix == ".json", f
            json.loads(f.read_text(encoding="utf-8"))
            n += 1
    return n


def assert_complete_or_absent(path: Path, rows: int | None = None) -> bool:
    """An output is absent or complete: it parses to the end (and has the expected row count)."""
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        lines = text.splitlines()
        assert text.endswith("\n") or not text, f"{path} does not end with a newline"
        parsed = [json.loads(line) for line in lines]
        if rows is not None:
            assert len(parsed) == rows, (path, len(parsed), rows)
    else:
        json.loads(text)
    return True


class FaultRag(FakeOpenAI):
    """Handle on tests/fault_rag_server.py (TEST FAKE wrapper around the real RAG app): the same
    script.json / requests.jsonl protocol as the fake OpenAI server."""


def start_fault_rag(project: Project, tmp_path: Path) -> tuple[FaultRag, subprocess.Popen]:
    state = tmp_path / "fault_rag"
    state.mkdir(exist_ok=True)
    port = free_port()
    proc = start_server([sys.executable, str(TESTS / "fault_rag_server.py"), "--config", "config.yaml", "--port",
                         str(port), "--state", str(state)], f"http://127.0.0.1:{port}/healthz", project.root,
                        tmp_path / "fault_rag.log")
    return FaultRag(f"http://127.0.0.1:{port}", state), proc


def successes_per_key(requests: list[dict]) -> Counter:
    return Counter(r["key"] for r in requests if r["status"] == 200)


def repeated(requests: list[dict]) -> int:
    return sum(c - 1 for c in successes_per_key(requests).values() if c > 1)


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def small_project(tmp_path_factory) -> Project:
    """fivedoctors trimmed to 6 queries, built and ingested once for the module."""
    project = Project(tmp_path_factory.mktemp("faults") / "proj")
    project.keep_queries("fivedoctors", 6)
    project.stage("build-excel")
    project.stage("ingest")
    return project


@pytest.fixture
def fault_rag(project, tmp_path):
    """The fault RAG server on the test's scratch project."""
    handle, proc = start_fault_rag(project, tmp_path)
    yield handle
    stop(proc)


# ------------------------------------------------------------------------------- teacher, each fault

@pytest.mark.slow
@pytest.mark.parametrize("fault", TEACHER_FAULTS, ids=str)
def test_teacher_retries_each_fault_then_succeeds(small_project, fake_openai, tmp_path, fault):
    project = clone(small_project, tmp_path / "p")
    use_openai_teacher(project, fake_openai.url, timeout_s=0.5 if fault == "timeout" else 5)
    fake_openai.script(fail_first={"status": fault, "n": 1, **({"retry_after": 1} if fault == 429 else {})},
                       hang_s=2)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl(PATHS["teacher"])
    assert len(rows) == 6
    assert all(r["status"] == "ok" and r["attempts"] == 2 and r["rewrite"].startswith("改写：") for r in rows), rows
    # The server saw exactly one fault, then one success, per prompt ("timeout" is logged when its hang ends).
    reqs = wait_for(lambda: (lambda r: r if len(r) >= 12 else None)(fake_openai.requests()))
    by_key = defaultdict(list)
    for r in sorted(reqs, key=lambda r: r["t"]):
        by_key[r["key"]].append(r)
    assert len(by_key) == 6
    for key, seq in by_key.items():
        statuses = sorted(str(r["status"]) for r in seq)
        assert statuses == sorted([str(fault), "200"]), (key, statuses)
        if fault == 429:  # Retry-After: 1 honoured although backoff_base_s is 0
            fail_t = next(r["t"] for r in seq if r["status"] == 429)
            ok_t = next(r["t"] for r in seq if r["status"] == 200)
            assert ok_t - fail_t >= 0.9, (key, ok_t - fail_t)
    stats = json.loads((project.root / PATHS["stats_teacher"]).read_text())
    assert stats["new_calls"] == 6 and stats["failed_calls"] == 0
    assert assert_cache_intact(project.root / "cache" / "teacher") == 6


@pytest.mark.slow
@pytest.mark.parametrize("fault", [503, "reset", "timeout", "malformed_json", "empty_choices", "truncated"], ids=str)
def test_teacher_down_fails_naming_the_service_and_writes_nothing(small_project, fake_openai, tmp_path, fault):
    project = clone(small_project, tmp_path / "p")
    use_openai_teacher(project, fake_openai.url, max_retries=1, timeout_s=0.3)
    fake_openai.script(fail_first={"status": fault, "n": 1000}, hang_s=1)
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "Traceback" not in err
    assert f"teacher API {fake_openai.url}" in err and "failed every call" in err, err
    assert "hint: check the service and rerun" in err
    assert not (project.root / PATHS["teacher"]).exists() and not (project.root / PATHS["stats_teacher"]).exists()
    assert not list(project.root.rglob("*.tmp"))


@pytest.mark.slow
def test_teacher_service_going_down_mid_stage_then_back(tmp_path, project, fake_openai):
    """Down after 15 answers: the circuit breaker stops the stage (nothing written); back up, the rerun
    completes and repeats none of the 15 answers that reached the cache."""
    project.keep_queries("fivedoctors", 60)
    project.stage("build-excel")
    project.stage("ingest")
    use_openai_teacher(project, fake_openai.url, concurrency=3, max_retries=0)
    fake_openai.script(down_after={"n": 15, "status": 503})
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2 and "failed 20 calls in a row" in proc.stderr, proc.stderr
    assert f"teacher API {fake_openai.url}" in proc.stderr and "rerun" in proc.stderr
    assert not (project.root / PATHS["teacher"]).exists()
    cached = assert_cache_intact(project.root / "cache" / "teacher")
    assert cached == 15
    fake_openai.script()  # the service is back
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl(PATHS["teacher"])
    assert len(rows) == 60 and all(r["status"] == "ok" for r in rows)
    assert repeated(fake_openai.requests()) == 0
    stats = json.loads((project.root / PATHS["stats_teacher"]).read_text())
    assert stats["cache_hits"] == 15 and stats["new_calls"] == 45


@pytest.mark.slow
def test_damaged_cache_entry_is_a_miss_not_an_answer(small_project, fake_openai, tmp_path):
    """Cache entries are renamed into place whole but not fsynced: after an OS crash one may be cut short.
    Such an entry reads as a miss; the call is made again and the output is whole."""
    project = clone(small_project, tmp_path / "p")
    use_openai_teacher(project, fake_openai.url)
    project.stage("teacher", env=ENV)
    first = project.read_jsonl(PATHS["teacher"])
    entries = sorted(cache_entries(project.root / "cache" / "teacher"))
    entries[0].write_bytes(entries[0].read_bytes()[: len(entries[0].read_bytes()) // 2])  # cut short
    entries[1].write_bytes(b"")                                                            # empty
    project.stage("teacher", env=ENV)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "latency_s"} for r in rows]  # noqa: E731
    assert strip(project.read_jsonl(PATHS["teacher"])) == strip(first)
    stats = json.loads((project.root / PATHS["stats_teacher"]).read_text())
    assert (stats["cache_hits"], stats["new_calls"]) == (4, 2)
    assert len(fake_openai.requests()) == 8
    assert assert_cache_intact(project.root / "cache" / "teacher") == 6


def test_truncated_stream_is_an_error_not_a_short_answer(fake_openai):
    """The fake's streaming cut is real: the SDK raises instead of returning a shortened text."""
    import openai

    client = openai.OpenAI(api_key="x", base_url=fake_openai.url, max_retries=0, timeout=5)
    messages = [{"role": "user", "content": "问题：深海鱼油每天吃几粒，饭前还是饭后"}]
    whole = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, stream=True) if c.choices)
    assert whole == "改写：深海鱼油每天吃几粒，饭前还是饭后"
    fake_openai.script(fail_first={"status": "truncated", "n": 99})
    got = []
    with pytest.raises(openai.APIError):
        for c in client.chat.completions.create(model="m", messages=messages, stream=True):
            got.extend(ch.delta.content or "" for ch in c.choices)
    assert "".join(got) != whole
    with pytest.raises(openai.APIConnectionError):  # the non-streaming cut, as the teacher sees it
        client.chat.completions.create(model="m", messages=messages)


# ---------------------------------------------------------------------------------- judge, each fault

@pytest.mark.parametrize("fault", TEACHER_FAULTS, ids=str)
def test_judge_faults_are_retried_and_never_cached_as_verdicts(fake_openai, tmp_path, monkeypatch, fault):
    from qrewrite.reward import reward_defaults
    from qrewrite.cache import DiskCache
    from qrewrite.reward.judge_openai import OpenAIJudge

    monkeypatch.setenv("QR_TEST_KEY", ENV["QR_TEST_KEY"])
    cfg = dict(reward_defaults()["judge"]["openai"], base_url=fake_openai.url, model="judge", api_key_env="QR_TEST_KEY",
               max_retries=1, backoff_base_s=0.0, backoff_max_s=0.0, timeout_s=0.5)
    fake_openai.script(default_reply='{"score": 4, "reason": "ok"}', hang_s=1,
                       fail_first={"status": fault, "n": 1, **({"retry_after": 0} if fault == 429 else {})})
    cache_dir = tmp_path / "judge"

    async def go(text):
        judge = OpenAIJudge(cfg, DiskCache(cache_dir))
        try:
            return await judge.judge("鱼油怎么吃", "", "", text), judge.stats()
        finally:
            await judge.aclose()

    verdict, stats = asyncio.run(go("深海鱼油每天吃几粒"))  # one fault, then the reply
    assert (verdict.score, verdict.cached) == (4.0, False) and stats["judge_calls"] == 2
    assert len(cache_entries(cache_dir)) == 1
    fake_openai.script(default_reply='{"score": 4, "reason": "ok"}', hang_s=1,
                       fail_first={"status": fault, "n": 1000})
    verdict, stats = asyncio.run(go("深海鱼油饭后吃"))  # stays down: a failure, neutral, not cached
    assert verdict.score is None and stats["judge_failures_service"] == 1, (verdict, stats)
    assert len(cache_entries(cache_dir)) == 1


# ----------------------------------------------------------------------------------- RAG faults

@pytest.fixture(scope="module")
def rag_template(tmp_path_factory) -> tuple[Project, list[dict]]:
    """fivedoctors trimmed to 30 queries with prf teacher rows, built once for the module, and the
    reference validation through the in-process local provider (the fault server runs the same BM25)."""
    project = Project(tmp_path_factory.mktemp("rag") / "proj")
    keep_unique_queries(project, 30)
    for stage in ("build-excel", "ingest", "teacher", "validate"):
        project.stage(stage)
    reference = project.read_jsonl(PATHS["validated"])
    (project.root / PATHS["validated"]).unlink()
    (project.root / PATHS["stats_validate"]).unlink()
    return project, reference


@pytest.fixture
def rag_case(rag_template, tmp_path):
    """(a fresh copy of the template, the reference validation, the fault RAG server on it)."""
    template, reference = rag_template
    project = clone(template, tmp_path / "p")
    handle, proc = start_fault_rag(project, tmp_path)
    yield project, reference, handle
    stop(proc)


def _same_retrieval(rows: list[dict], reference: list[dict]) -> None:
    assert [r["id"] for r in rows] == [r["id"] for r in reference]
    for got, want in zip(rows, reference):
        for side in ("rewrite_rag", "original_rag"):
            assert [h["doc_id"] for h in got[side]["hits"]] == [h["doc_id"] for h in want[side]["hits"]]
            assert got[side]["top1"] == pytest.approx(want[side]["top1"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("status", [429, 500, 503])
def test_validation_retries_rag_failures(rag_case, status):
    project, reference, fault_rag = rag_case
    use_http_rag(project, fault_rag.url)
    fault_rag.script(fail={"status": status, "n": 1, "retry_after": 0})
    project.stage("validate")
    _same_retrieval(project.read_jsonl(PATHS["validated"]), reference)
    per_key = defaultdict(list)
    for r in fault_rag.requests():
        per_key[r["key"]].append(r["status"])
    # one fault per distinct request, then success; a request sent twice (query + history equal to the teacher's
    # rewrite, say) finds the fault spent
    assert len(per_key) >= 30 and all(v[0] == status and v[1:] and set(v[1:]) == {200} for v in per_key.values()), \
        per_key


@pytest.mark.slow
def test_validation_slow_rag_within_timeout_completes(rag_case):
    project, reference, fault_rag = rag_case
    use_http_rag(project, fault_rag.url, concurrency=8, timeout_s=5)
    fault_rag.script(latency_s=0.3)
    t0 = time.monotonic()
    project.stage("validate")
    wall = time.monotonic() - t0
    _same_retrieval(project.read_jsonl(PATHS["validated"]), reference)
    searches = len(fault_rag.requests())
    # `searches` at 0.3 s with 8 in flight: at least that many rounds of latency, i.e. the delay was real.
    assert searches >= 30 and wall >= 0.3 * (searches // 8)


@pytest.mark.slow
def test_validation_rag_too_slow_fails_clearly(rag_case):
    project, _, fault_rag = rag_case
    use_http_rag(project, fault_rag.url, timeout_s=0.2, max_retries=1)
    fault_rag.script(latency_s=1.0)
    proc = project.stage("validate", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"RAG service {fault_rag.url}/api/chat/general_rag failed after 2 attempts" in proc.stderr
    assert "ReadTimeout" in proc.stderr and "rerun resumes" in proc.stderr and "Traceback" not in proc.stderr
    assert not (project.root / PATHS["validated"]).exists() and not (project.root / PATHS["stats_validate"]).exists()


@pytest.mark.slow
def test_validation_rag_going_down_mid_stage_then_back(rag_case):
    project, reference, fault_rag = rag_case
    use_http_rag(project, fault_rag.url, concurrency=2, max_retries=1)
    fault_rag.script(down_after={"n": 20, "status": 503})
    proc = project.stage("validate", check=False)
    assert proc.returncode == 2 and "HTTP 503" in proc.stderr and fault_rag.url in proc.stderr, proc.stderr
    assert "serve-rag" in proc.stderr and "rerun resumes" in proc.stderr
    assert not (project.root / PATHS["validated"]).exists()
    # 20 searches were let through (a request sent twice, with query + history equal to the teacher's rewrite,
    # say, is one key); one still in flight when the stage gave up may not have been cached.
    before = fault_rag.requests()
    answered = {r["key"] for r in before if r["status"] == 200}
    cached = assert_cache_intact(project.root / "cache" / "rag")
    assert len(answered) - 1 <= cached <= len(answered) and sum(r["status"] == 200 for r in before) == 20
    fault_rag.script()
    project.stage("validate")
    _same_retrieval(project.read_jsonl(PATHS["validated"]), reference)
    stats = json.loads((project.root / PATHS["stats_validate"]).read_text())
    again = answered & {r["key"] for r in fault_rag.requests()[len(before):] if r["status"] == 200}
    assert stats["rag_cache_hits"] >= cached and len(again) == len(answered) - cached, (again, cached)


# ------------------------------------------------------------------ RAG responses of the wrong shape

def _recall(*items) -> dict:
    return {"code": 0, "message": "ok", "data": {"recall": list(items)}}


RAG_SHAPES = [  # (case, what the service answers with HTTP 200, what stderr must say)
    ("no-recall", {"code": 0, "data": {}}, ["has no list at 'data.recall'", "top-level keys: ['code', 'data']",
                                            "hint: set rag.http.fields.recall_path"]),
    ("recall-not-a-list", {"code": 0, "data": {"recall": {"doc_id": "fd-001"}}}, ["has no list at 'data.recall'"]),
    ("top-level-list", [{"doc_id": "fd-001", "reranker_score": 0.9}], ["has no list at", "top-level keys: list"]),
    ("item-not-an-object", _recall("fd-001"), ["recall[0] lacks 'doc_id' or 'reranker_score'",
                                               "hint: set rag.http.fields.doc_id / .score"]),
    ("score-field-renamed", _recall({"doc_id": "fd-001", "score": 0.9}),
     ["recall[0] lacks 'doc_id' or 'reranker_score'"]),
    ("score-not-a-number", _recall({"doc_id": "fd-001", "reranker_score": "high"}),
     ["recall[0].reranker_score is not a finite number: 'high'"]),
    ("score-nan", _recall({"doc_id": "fd-001", "reranker_score": 0.5},
                          {"doc_id": "fd-002", "reranker_score": float("nan")}),
     ["recall[1].reranker_score is not a finite number: nan"]),
    ("score-bool", _recall({"doc_id": "fd-001", "reranker_score": True}), ["is not a finite number: True"]),
    ("doc-id-null", _recall({"doc_id": None, "reranker_score": 0.5}), ["recall[0].doc_id is not a document id: None"]),
    ("html-with-200", "<html><body>502 Bad Gateway</body></html>",
     ["failed after 2 attempts (last: response body is not JSON)", "rerun resumes"]),
]


@pytest.fixture(scope="module")
def shapes_case(rag_template, tmp_path_factory):
    """One copy of the template and one fault RAG server for the whole table (cases only change the script)."""
    template, _ = rag_template
    tmp = tmp_path_factory.mktemp("shapes")
    project = clone(template, tmp / "p")
    handle, proc = start_fault_rag(project, tmp)
    use_http_rag(project, handle.url, max_retries=1)
    yield project, handle
    stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize("case,reply,expect", RAG_SHAPES, ids=[c[0] for c in RAG_SHAPES])
def test_rag_response_of_the_wrong_shape(shapes_case, case, reply, expect):
    project, fault_rag = shapes_case
    fault_rag.script(**({"raw_reply": reply} if isinstance(reply, str) else {"reply": reply}))
    proc = project.stage("validate", check=False)
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "qrewrite validate: error: " in err and "Traceback" not in err and "hint:" in err, err
    assert f"{fault_rag.url}/api/chat/general_rag" in err
    if case != "html-with-200":
        assert "for query '" in err, err  # which search got the bad answer
    for s in expect:
        assert s in err, f"{s!r} not in:\n{err}"
    assert not (project.root / PATHS["validated"]).exists() and not (project.root / PATHS["stats_validate"]).exists()
    assert not list((project.root / "results").rglob("*.tmp"))
    assert not list((project.root / "cache" / "rag").rglob("*.json"))  # a wrong-shaped answer is never cached


# -------------------------------------------------------------------------------------------- kill -9

def kill_at_random_points(project: Project, argv: list[str], progress, rng: random.Random, kills_wanted: int,
                          outputs: list[Path], cache_dir: Path, env: dict | None = None) -> tuple[int, list]:
    """Start the stage and SIGKILL it at a random point, again and again. Points are either a random
    number of newly cached calls (mid-calls) or a random time after start (start-up, loading, calls,
    writing). Returns (kills, kill points)."""
    kills, points = 0, []
    cmd = [sys.executable, "-m", "qrewrite", *argv]
    while kills < kills_wanted:
        before = progress()
        proc = subprocess.Popen(cmd, cwd=project.root, env={**os.environ, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = time.monotonic()
        if rng.random() < 0.3:
            at = rng.uniform(0.05, 2.5)
            point = ("time", round(at, 2))
            fire = lambda: time.monotonic() - start >= at  # noqa: E731
        else:
            target = before + rng.randint(1, 15)
            point = ("calls", target)
            fire = lambda: progress() >= target  # noqa: E731
        while proc.poll() is None and not fire():
            time.sleep(0.005)
        if proc.poll() is not None:  # finished before the kill point: its outputs must be complete
            assert proc.returncode == 0
            assert all(assert_complete_or_absent(o) for o in outputs)
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        points.append(point)
        for o in outputs:
            assert_complete_or_absent(o)
        assert_cache_intact(cache_dir)
    return kills, points


@pytest.mark.slow
def test_kill_9_teacher_and_validation_at_random_points(project, fake_openai, fault_rag, tmp_path, capsys):
    """>= 20 kill -9s (seeded, so the run is reproducible) across the teacher and validation stages."""
    rng = random.Random(6)
    n = 200
    keep_unique_queries(project, n)
    project.stage("build-excel")
    project.stage("ingest")
    n = len(project.read_jsonl(PATHS["queries"]))

    # Teacher: openai provider against the fake, 4 calls in flight, 80 ms each.
    use_openai_teacher(project, fake_openai.url, concurrency=4)
    fake_openai.script(latency_s=0.08)
    tcache = project.root / "cache" / "teacher"
    t_out = [project.root / PATHS["teacher"], project.root / PATHS["stats_teacher"]]
    t_kills, t_points = kill_at_random_points(project, TEACH_ARGV, lambda: len(cache_entries(tcache)), rng, 12,
                                              t_out, tcache, ENV)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl(PATHS["teacher"])
    assert len(rows) == n and all(r["status"] == "ok" for r in rows)
    t_reqs = fake_openai.requests()
    assert len(successes_per_key(t_reqs)) == n
    # A call in flight at a kill may have been answered without reaching the cache: at most 4 per kill.
    # Every answer that reached the cache is never asked for again.
    t_repeats = repeated(t_reqs)
    assert t_repeats <= 4 * t_kills, t_repeats
    assert assert_cache_intact(tcache) == n
    project.stage("teacher", env=ENV)
    assert len(fake_openai.requests()) == len(t_reqs)  # a warm rerun makes no call at all

    # Validation: HTTP provider against the real RAG app (fault wrapper: 60 ms per search), 4 in flight.
    use_http_rag(project, fault_rag.url, concurrency=4)
    fault_rag.script(latency_s=0.06)
    rcache = project.root / "cache" / "rag"
    v_out = [project.root / PATHS["validated"], project.root / PATHS["stats_validate"]]
    v_kills, v_points = kill_at_random_points(project, VALIDATE_ARGV, lambda: len(cache_entries(rcache)), rng,
                                              max(10, 22 - t_kills), v_out, rcache)
    project.stage("validate")
    validated = project.read_jsonl(PATHS["validated"])
    assert len(validated) == n
    v_reqs = fault_rag.requests()
    v_repeats = repeated(v_reqs)
    assert v_repeats <= 4 * v_kills, v_repeats
    assert len(successes_per_key(v_reqs)) == assert_cache_intact(rcache)
    project.stage("validate")
    assert len(fault_rag.requests()) == len(v_reqs)

    assert t_kills + v_kills >= 20, (t_kills, v_kills)
    with capsys.disabled():
        print(f"\nkill -9: teacher {t_kills} kills {t_points}, {t_repeats} repeated answers; "
              f"validation {v_kills} kills {v_points}, {v_repeats} repeated answers")


@pytest.mark.slow
def test_kill_9_snakemake_never_takes_a_partial_file_as_done(project, fake_openai, fault_rag, tmp_path, capsys):
    """Kill the whole Snakemake process group mid-run; outputs on disk are complete or absent, and the
    recovery Snakemake asks for (`--unlock`, then `--rerun-incomplete`) finishes, repeating no call
    whose answer reached a cache."""
    rng = random.Random(66)
    keep_unique_queries(project, 100)
    use_openai_teacher(project, fake_openai.url, concurrency=4)
    use_http_rag(project, fault_rag.url, concurrency=4)
    fake_openai.script(latency_s=0.1)
    fault_rag.script(latency_s=0.03)
    targets = [PATHS["summary"], PATHS["train"], PATHS["val"], PATHS["test"]]
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, **ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def snakemake(*extra):
        return [str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile",
                str(project.config_path), "--cores", "2", *extra, *targets]

    outputs = [PATHS["queries"], PATHS["teacher"], PATHS["validated"], PATHS["train"], PATHS["summary"], PATHS["stats_teacher"],
               PATHS["stats_validate"]]
    kills = []
    for _ in range(4):
        proc = subprocess.Popen(snakemake("--rerun-incomplete"), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        at = rng.uniform(3.0, 14.0)
        try:
            proc.wait(at)
            break  # finished before the kill point
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills.append(round(at, 1))
        time.sleep(0.3)  # let the killed group's sockets close
        subprocess.run(snakemake("--unlock"), env=env, capture_output=True, check=True, timeout=120)
        for rel in outputs:
            assert_complete_or_absent(project.root / rel)
        assert_cache_intact(project.root / "cache" / "teacher")
        assert_cache_intact(project.root / "cache" / "rag")
    proc = subprocess.run(snakemake("--rerun-incomplete"), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rel in outputs:
        assert assert_complete_or_absent(project.root / rel), rel
    n = len(project.read_jsonl(PATHS["queries"]))
    assert len(project.read_jsonl(PATHS["validated"])) == n
    assert [r["status"] for r in project.read_jsonl(PATHS["teacher"])] == ["ok"] * n
    assert repeated(fake_openai.requests()) <= 4 * len(kills)
    assert repeated(fault_rag.requests()) <= 4 * len(kills)
    dry = subprocess.run(snakemake("-n"), env=env, capture_output=True, text=True, timeout=120)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
    assert len(kills) >= 2, kills
    with capsys.disabled():
        print(f"\nsnakemake kill -9 at {kills} s; repeated answers: teacher {repeated(fake_openai.requests())}, "
              f"rag {repeated(fault_rag.requests())}")


@pytest.mark.slow
def test_snakemake_with_service_down_marks_nothing_complete(project, fake_openai):
    project.keep_queries("fivedoctors", 8)
    use_openai_teacher(project, fake_openai.url, max_retries=0)
    fake_openai.script(fail_first={"status": 503, "n": 1000})
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, **ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile", str(project.config_path),
           "--cores", "2", PATHS["summary"]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    log = (project.root / "logs/fivedoctors/teacher.log").read_text()
    assert f"teacher API {fake_openai.url} failed every call" in log and "rerun" in log
    assert not (project.root / PATHS["teacher"]).exists()
    dry = subprocess.run([*cmd, "-n"], env=env, capture_output=True, text=True, timeout=120)
    assert "teacher" in dry.stdout and "Nothing to be done" not in dry.stdout
