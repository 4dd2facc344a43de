"""The data half end to end through Snakemake, as `make run` runs it, in a scratch directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from qrewrite.paths import tenant_paths


def snakemake(project, *args, check=True):
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile",
                           str(project.config_path), "--cores", "2", *args], capture_output=True, text=True, env=env,
                          timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-5000:])
    return proc


@pytest.mark.slow
def test_snakemake_builds_every_artifact_for_both_tenants(project):
    snakemake(project, "data")
    for tenant in ("fivedoctors", "chengla"):
        p = tenant_paths(tenant)
        assert (project.root / f"data/raw/{tenant}.xlsx").exists()
        queries = project.read_jsonl(p["queries"])
        teacher = project.read_jsonl(p["teacher"])
        validated = project.read_jsonl(p["validated"])
        assert len(queries) >= 200 and len(teacher) == len(queries)
        assert {"id", "row", "query", "profile", "history", "gold_doc_ids"} <= set(queries[0])
        assert {"id", "rewrite", "status", "provider", "model", "prompt_hash", "usage", "latency_s",
                "cost_usd"} <= set(teacher[0])
        v = validated[0]
        assert {"top1", "mean_top3", "recall_count", "hits"} <= set(v["rewrite_rag"]) and "gain" in v
        splits = {s: project.read_jsonl(p[s]) for s in ("train", "val", "test")}
        assert all(splits.values())
        ids = [set(r["meta"]["query_id"] for r in rows) for rows in splits.values()]
        assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
        summary = json.loads((project.root / p["summary"]).read_text())
        funnel = {f["stage"]: f for f in summary["funnel"]}
        assert funnel["split"]["out"] == sum(len(v) for v in splits.values())
        assert all(f["in"] == f["out"] + f["dropped"] for f in summary["funnel"])
        hit = summary["retrieval"]["hit_at_1"]
        # The demo data is built so that a context-aware rewrite beats the raw query.
        assert hit["rewrite"] > hit["original"] + 0.05, hit
    # Nothing left to do on a second invocation; no temp files anywhere in results.
    dry = snakemake(project, "-n", "data")
    assert "Nothing to be done" in dry.stdout + dry.stderr
    assert not list((project.root / "results").rglob("*.tmp"))


@pytest.mark.slow
def test_changing_one_tenants_source_reruns_only_that_tenant(project):
    snakemake(project, "data")
    src = project.root / "data/demo/chengla.queries.jsonl"
    src.write_text(src.read_text(encoding="utf-8") + json.dumps(
        {"query": "雅思课程可以退费吗", "profile": "", "history": "", "gold_doc_ids": []}, ensure_ascii=False) + "\n",
        encoding="utf-8")
    dry = snakemake(project, "-n", "-p", "data")
    out = dry.stdout + dry.stderr
    assert "--tenant chengla" in out and "build-excel" in out
    assert "--tenant fivedoctors" not in out
