"""RAG validation: local BM25, the HTTP path against `qrewrite serve-rag` on loopback, and failures."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import free_port
from qrewrite.runtime.route import with_history
from qrewrite.kb import load_kb
from qrewrite.rag.local import LocalRetriever
from conftest import REPO


def test_local_scores_are_normalised_and_ranked():
    r = LocalRetriever(load_kb(REPO / "data/kb/fivedoctors.jsonl"), "zh")
    hits = r.search("深海鱼油软胶囊 孕妇能吃吗", top_k=5)
    assert len(hits) == 5
    scores = [h["reranker_score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    # Appending unrelated junk does not inflate the score (normalised by the query's own reference).
    junk = r.search("深海鱼油软胶囊 孕妇能吃吗 火箭 量子 足球 吉他", top_k=1)
    assert junk[0]["reranker_score"] < hits[0]["reranker_score"]
    assert r.search("完全无关的火星文字", top_k=5) == [] or r.search("完全无关的火星文字", 5)[0]["reranker_score"] < 0.3


def _run_to_validate(project):
    project.keep_queries("fivedoctors", 40)
    project.stage("build-excel")
    project.stage("ingest")
    project.stage("teacher")


@pytest.mark.slow
def test_http_rag_matches_local(project, rag_server):
    _run_to_validate(project)
    project.stage("validate")
    local = project.read_jsonl("results/fivedoctors/validated.jsonl")
    # Same request shape a tenant's service gets: POST /api/chat/general_rag.
    resp = httpx.post(f"{rag_server}/api/chat/general_rag", json={
        "query": "鱼油孕妇能吃吗", "rewritten_query": "深海鱼油软胶囊 孕妇", "tenant_id": "fivedoctors",
        "kb_name": "fivedoctors_kb", "top_k": 3, "score_threshold": 0.0})
    assert resp.status_code == 200
    recall = resp.json()["data"]["recall"]
    assert len(recall) == 3 and {"doc_id", "content", "reranker_score"} <= set(recall[0])
    project.update(rag={"provider": "http", "http": {"base_url": rag_server}})
    project.stage("validate")
    remote = project.read_jsonl("results/fivedoctors/validated.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "rag_provider"} for r in rows]
    assert strip(remote) == strip(local)
    stats = json.loads((project.root / "results/fivedoctors/stats/validate.json").read_text())
    # raw query, query + history and the teacher's rewrite per row; a search asked twice is one call
    history = {r["id"]: r for r in project.read_jsonl("results/fivedoctors/queries.jsonl")}
    searches = {(r["query"], text) for r in remote
                for text in (r["rewrite"], "", with_history(r["query"], history[r["id"]]))}
    assert stats["rag_calls"] == len(searches) and len(searches) > 2 * len(remote)


def test_unknown_tenant_on_rag_server_is_an_error(rag_server):
    resp = httpx.post(f"{rag_server}/api/chat/general_rag", json={"query": "x", "tenant_id": "nosuch"})
    assert resp.status_code == 404 and "nosuch" in resp.text


@pytest.mark.slow
def test_rag_down_fails_clearly_and_writes_nothing(project):
    _run_to_validate(project)
    port = free_port()
    project.update(rag={"provider": "http", "http": {"base_url": f"http://127.0.0.1:{port}", "max_retries": 1,
                                                     "backoff_base_s": 0.0}})
    proc = project.stage("validate", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr and "serve-rag" in proc.stderr and "Traceback" not in proc.stderr
    assert not (project.root / "results/fivedoctors/validated.jsonl").exists()


@pytest.mark.slow
def test_rag_response_of_wrong_shape_names_the_field(project, fake_openai):
    """Point the RAG client at a real server that answers JSON of another shape."""
    _run_to_validate(project)
    base = fake_openai.url.rsplit("/v1", 1)[0]
    project.update(rag={"provider": "http", "http": {"base_url": base, "path": "/echo"}})
    proc = project.stage("validate", check=False)
    assert proc.returncode == 2
    assert "data.recall" in proc.stderr and "recall_path" in proc.stderr
    assert not (project.root / "results/fivedoctors/validated.jsonl").exists()


def test_rag_server_binds_loopback_by_default():
    from qrewrite.config import load_config

    assert load_config(REPO / "config.yaml")["rag"]["serve"]["host"] == "127.0.0.1"
