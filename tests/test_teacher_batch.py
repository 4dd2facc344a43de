"""`teacher.mode: batch` against the test server's Batch API (tests/fake_openai_server.py, a TEST FAKE): one job for
the rows not cached, kill -9 while polling resumes the same job (never a second submission), answers cached under the
synchronous call's key at half the list price, failed rows retried synchronously."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qrewrite.paths import tenant_paths

ENV = {"QR_TEST_KEY": "sk-test-not-a-real-key"}
P = tenant_paths("fivedoctors")
TEACHER = ["-m", "qrewrite", "teacher", "--config", "config.yaml", "--tenant", "fivedoctors", "--queries", P["queries"],
           "--out", P["teacher"], "--stats", P["stats_teacher"], "--no-progress"]


def _batch_project(project, url: str, n: int = 24, mode: str = "batch") -> None:
    """The shipped teacher settings (gpt-5), provider openai, in batch mode, polling every 0.2 s."""
    project.keep_queries("fivedoctors", n)
    cfg = project.config
    cfg["teacher"].update(provider="openai", mode=mode, concurrency=4, batch={"poll_s": 0.2})
    cfg["teacher"]["openai"].update(base_url=url, api_key_env="QR_TEST_KEY", backoff_base_s=0.0)
    project.set_config(cfg)
    project.stage("build-excel")
    project.stage("ingest")


def _by(requests: list[dict], endpoint: str) -> list[dict]:
    return [r for r in requests if r.get("endpoint") == endpoint]


def _wait(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError("condition not met")


def _start_teacher(project, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / "teacher.log", "w")
    return subprocess.Popen([sys.executable, *TEACHER], cwd=project.root, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **ENV}, start_new_session=True)


def _kill9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def _list_price(row: dict) -> float:
    u = row["usage"]
    return u["prompt_tokens"] * 1.25 / 1e6 + u["completion_tokens"] * 10.0 / 1e6  # gpt-5


@pytest.mark.slow
def test_batch_kill_9_while_polling_resumes_the_same_job(project, fake_openai, tmp_path):
    _batch_project(project, fake_openai.url)
    fake_openai.script(batch_delay_s=3600)  # the job runs until the test lets it finish
    proc = _start_teacher(project, tmp_path)
    try:
        _wait(lambda: len(_by(fake_openai.requests(), "batches.retrieve")) >= 2)
    finally:
        _kill9(proc)
    first = fake_openai.requests()
    (created,) = _by(first, "batches.create")
    assert len(_by(first, "files.create")) == 1 and not _by(first, "chat")
    (state,) = (project.root / "cache/teacher/batches").glob("*.json")
    job = json.loads(state.read_text())
    assert job["batch_id"] == created["batch_id"] and job["status"] == "submitted" and job["input_file_id"]
    assert not (project.root / P["teacher"]).exists()

    fake_openai.script(batch_delay_s=0)  # the job is done by the next poll
    project.stage("teacher", env=ENV)
    second = fake_openai.requests()[len(first):]
    assert not _by(second, "batches.create") and not _by(second, "files.create") and not _by(second, "chat")
    assert {r["batch_id"] for r in _by(second, "batches.retrieve")} == {created["batch_id"]}
    rows = project.read_jsonl(P["teacher"])
    keys = {r["call_key"] for r in rows}
    assert len(rows) == 24 and all(r["status"] == "ok" and r["batch_id"] == created["batch_id"] for r in rows)
    assert len(_by(second, "batch_row")) == len(keys)  # each distinct prompt answered once, by the job
    assert all(r["cost_usd"] == pytest.approx(0.5 * _list_price(r), abs=1e-8) for r in rows)  # the batch rate
    stats = json.loads((project.root / P["stats_teacher"]).read_text())
    assert stats["batch"] == {"jobs": [created["batch_id"]], "submitted": 0, "answered": len(keys), "failed": 0}
    assert stats["new_calls"] == 0 and stats["failed_calls"] == 0
    assert json.loads(state.read_text())["status"] == "collected"

    n = len(fake_openai.requests())
    project.stage("teacher", env=ENV)  # a further rerun: nothing to submit, poll or call
    assert len(fake_openai.requests()) == n
    cfg = project.config
    cfg["teacher"]["mode"] = "sync"
    project.set_config(cfg)
    project.stage("teacher", env=ENV)  # a sync run finds the batch's answers under the same keys
    assert len(fake_openai.requests()) == n
    assert project.read_jsonl(P["teacher"]) == rows


@pytest.mark.slow
def test_batch_kill_9_before_the_job_id_is_recorded_finds_the_job(project, fake_openai, tmp_path):
    """Killed after the job was created but before its id came back: the rerun finds it by its input file in
    batches.list, and submits nothing again."""
    _batch_project(project, fake_openai.url, n=10)
    fake_openai.script(batch_create_delay_s=3600)
    proc = _start_teacher(project, tmp_path)
    try:
        _wait(lambda: _by(fake_openai.requests(), "batches.create"))
    finally:
        _kill9(proc)
    (state,) = (project.root / "cache/teacher/batches").glob("*.json")
    job = json.loads(state.read_text())
    assert job["status"] == "uploaded" and job["batch_id"] is None

    fake_openai.script()
    project.stage("teacher", env=ENV)
    reqs = fake_openai.requests()
    assert len(_by(reqs, "batches.create")) == 1 and len(_by(reqs, "files.create")) == 1 and _by(reqs, "batches.list")
    assert not _by(reqs, "chat")
    rows = project.read_jsonl(P["teacher"])
    assert all(r["status"] == "ok" and r["batch_id"] == _by(reqs, "batches.create")[0]["batch_id"] for r in rows)


@pytest.mark.slow
def test_batch_rows_that_failed_are_retried_synchronously(project, fake_openai):
    _batch_project(project, fake_openai.url, n=20)
    queries = project.read_jsonl(P["queries"])
    marker = queries[4]["query"]
    fake_openai.script(batch_fail_if_contains={marker: 500})
    project.stage("teacher", env=ENV)
    rows = {r["id"]: r for r in project.read_jsonl(P["teacher"])}
    assert all(r["status"] == "ok" for r in rows.values())
    retried = [rows[q["id"]] for q in queries if marker in q["query"]]
    reqs = fake_openai.requests()
    failed_in_batch = [r for r in _by(reqs, "batch_row") if r["status"] == 500]
    assert failed_in_batch and len(_by(reqs, "chat")) == len({r["call_key"] for r in retried}) == len(failed_in_batch)
    assert all("batch_id" not in r and r["cost_usd"] == pytest.approx(_list_price(r), abs=1e-8) for r in retried)  # list price
    stats = json.loads((project.root / P["stats_teacher"]).read_text())
    assert stats["batch"]["failed"] == len(failed_in_batch) and stats["new_calls"] == len(failed_in_batch)
