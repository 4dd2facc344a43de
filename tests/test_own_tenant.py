"""A tenant of one's own whose data cannot teach a student: the training gate stops the run before SFT and says
what to set; `student: always` trains anyway; `student: never` runs the rules only. The gate on hand-made figures,
then a tenant of another shape than the demo's (scripts/make_sights_tenant.py: sights, plain titles, people's
rewrites) with the default `resolve` teacher, which does not fit it, through Snakemake."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, Project
from qrewrite.config import load_config, validate_config
from qrewrite.errors import QrewriteError
from qrewrite.paths import tenant_paths
from qrewrite.training.gate import run_gate


def summary(teacher: float, query_history: float, train: int, dropped: dict | None = None) -> dict:
    mean = lambda m: {"mean": m, "ci_low": m - 0.05, "ci_high": m + 0.05, "n": 200}  # noqa: E731
    return {"splits": {"train": train, "val": 40, "test": 80},
            "stages": {"validate": {"teacher_fit": {
                "n": 200, "teacher_failed": 3, "raw": mean(0.1), "query_history": mean(query_history),
                "teacher": mean(teacher), "teacher_minus_query_history": {"diff": round(teacher - query_history, 6),
                                                                          "ci_low": -0.1, "ci_high": 0.0}}},
                       "split": {"dropped": dropped or {}}}}


@pytest.fixture
def cfg_tenant():
    cfg = load_config(REPO / "config.yaml")
    return cfg, cfg["tenants"][0]


def test_a_teacher_below_query_history_stops_before_sft_saying_what_to_set(cfg_tenant):
    cfg, tenant = cfg_tenant
    with pytest.raises(QrewriteError) as err:
        run_gate(cfg, tenant, summary(teacher=0.017, query_history=0.40, train=200))
    first = str(err.value).splitlines()[0]
    assert first.startswith("tenant fivedoctors: stopped before SFT: the teacher (resolve) puts a gold document "
                            "first for 1.7% of the 200 rows with gold, below query + history's 40.0% (raw query 10.0%")
    text = str(err.value)
    for want in ("teacher.provider: openai", "teacher.provider: column", "tenants[].student: never",
                 "tenants[].student: always", "qrewrite tenant init"):
        assert want in text, want


def test_too_few_training_rows_stop_naming_what_dropped_them(cfg_tenant):
    cfg, tenant = cfg_tenant
    with pytest.raises(QrewriteError) as err:
        run_gate(cfg, tenant, summary(teacher=0.9, query_history=0.8, train=4,
                                      dropped={"gold_not_retrieved": 120, "held_out_gold_set": 5, "negative_gain": 3}))
    text = str(err.value)
    assert "the split kept 4 training rows, under gate.min_train_rows (40); not training targets in its training " \
           "groups: gold_not_retrieved 120, negative_gain 3" in text
    assert "the most rows were lost to gold_not_retrieved" in text and "held_out_gold_set" not in text


def test_a_teacher_that_fits_passes_and_always_trains_anyway(cfg_tenant, caplog):
    cfg, tenant = cfg_tenant
    doc = run_gate(cfg, tenant, summary(teacher=0.92, query_history=0.78, train=135))
    assert doc["passed"] and doc["findings"] == [] and doc["train_rows"] == 135
    doc = run_gate(cfg, {**tenant, "student": "always"}, summary(teacher=0.2, query_history=0.78, train=5))
    assert not doc["passed"] and [f["check"] for f in doc["findings"]] == ["teacher_vs_query_history",
                                                                           "min_train_rows"]
    assert "training anyway" in caplog.text
    # the check is a setting
    cfg["gate"] = {**cfg["gate"], "teacher_vs_query_history": False, "min_train_rows": 1}
    assert run_gate(cfg, tenant, summary(teacher=0.2, query_history=0.78, train=5))["passed"]


def snakemake(root, *args: str) -> subprocess.CompletedProcess:
    exe = REPO / ".venv/bin/snakemake"
    exe = exe if exe.exists() else "snakemake"
    return subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(root), "--cores", "2", *args],
                          capture_output=True, text=True, timeout=600)


def test_a_rules_only_tenant_has_no_student_stage_and_a_release_among_the_rules(tmp_path):
    """tenants[].student: never: no gate, SFT, RL or model candidate for that tenant; its release is chosen among
    the rules (no --sft / --rl); eval scores the rules, the teacher and the release. dvc.yaml leaves it out and
    says so. The other tenant is untouched."""
    project = Project(tmp_path / "proj")
    project.update_tenant("chengla", student="never")
    out = snakemake(project.root, "-n", "-p", "--forceall")
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = out.stdout
    fivedoctors = [line for line in jobs.splitlines() if "--tenant fivedoctors" in line]
    for rule in ("training_gate", "sft_targets", "sft", "merge_sft", "rl_data", "rl"):
        assert any(f"qrewrite {rule.replace('_', '-')} " in line for line in fivedoctors), rule
    chengla = [line for line in jobs.splitlines() if "--tenant chengla" in line]
    assert chengla and not any(f"qrewrite {c} " in line for line in chengla
                               for c in ("training-gate", "sft-targets", "sft", "merge-sft", "rl-data", "rl"))
    release = next(line for line in chengla if "qrewrite release " in line)
    assert "--sft" not in release and "--rl" not in release
    assert not any("--candidate sft" in line or "--candidate rl" in line for line in chengla)
    ev = next(line for line in chengla if "qrewrite eval " in line)
    assert "results/chengla/eval/release.jsonl" in ev and "results/chengla/eval/sft.jsonl" not in ev
    dvc = subprocess.run([sys.executable, "-m", "qrewrite", "dvc-yaml", "--out", str(tmp_path / "dvc.yaml")],
                         cwd=project.root, capture_output=True, text=True)
    assert dvc.returncode == 0, dvc.stderr
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    assert "chengla" not in json.dumps(stages) and "fivedoctors" in json.dumps(stages)
    assert "rules-only tenant(s) chengla" in dvc.stderr


def test_the_release_of_a_rules_only_tenant_chooses_among_the_rules():
    from qrewrite.release.score import release_candidates

    cfg = validate_config(yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8")))
    tenant = next(t for t in cfg["tenants"] if t["name"] == "chengla")  # its teacher: the embedded resolve rule
    names = [c["name"] for c in release_candidates(cfg, tenant, rules_only=True)[0]]
    assert names == ["query_history", "raw", "teacher"]
    students = [c for c in release_candidates(cfg, tenant)[0] if c["kind"] == "model"]
    assert len(students) == len(cfg["release"]["decoding"]) * len({c["source"] for c in students})
    # an API teacher is a paid call at serving time: rules only means query + history and the query alone
    api = {**tenant, "teacher": {"provider": "openai"}}
    assert [c["name"] for c in release_candidates(cfg, api, rules_only=True)[0]] == ["query_history", "raw"]


@pytest.mark.slow
def test_a_tenant_whose_teacher_does_not_fit_stops_before_sft(tmp_path):
    """The sights tenant (plain titles). With the default `resolve` teacher the run stops at the teacher stage,
    naming the teachers that fit; with its people's rewrites mis-mapped (columns.rewrite naming the question column:
    the "rewrites" are the questions) the data half completes, its card shows the teacher's fit, and the run stops
    at the training gate, before SFT, its first lines giving the figures and what to set."""
    project = Project(tmp_path / "proj")
    subprocess.run([sys.executable, str(REPO / "scripts/make_sights_tenant.py"), "--rows", "120"], cwd=project.root,
                   check=True, capture_output=True)
    cfg = project.config
    sights = {
        "name": "sights", "language": "zh", "raw_excel": "data/raw/sights.xlsx",
        "system_prompt": "你是旅游景点知识库的检索查询改写助手。把用户问题改写成完整独立的检索查询。只输出改写后的查询。",
        "columns": {"query": "问题", "profile": "用户画像", "history": "对话历史", "gold": "相关文档",
                    "difficulty": None},
        "kb": {"path": "data/kb/sights.jsonl", "name": "sights_kb",
               "fields": {"doc_id": "id", "title": "title", "content": "text"}}}
    cfg["tenants"].append(sights)
    project.set_config(cfg)
    p = tenant_paths("sights")
    out = snakemake(project.root, "--config", "only=sights")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "teacher.provider resolve cannot rewrite for tenant sights" in text, text[-3000:]
    assert "`teacher: {provider: column}`" in text and "`teacher: {provider: openai}`" in text
    assert not (project.root / p["teacher"]).exists() and not (project.root / "models/sights").exists()

    project.update_tenant("sights", columns={**sights["columns"], "rewrite": "问题"}, teacher={"provider": "column"})
    out = snakemake(project.root, "--config", "only=sights")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    first = next(line for line in text.splitlines() if "stopped before SFT" in line)
    assert "tenant sights: stopped before SFT: the teacher (column) puts a gold document first for" in first, first
    assert "below query + history's" in first
    assert "teacher.provider: openai" in text and "tenants[].student: never" in text
    card = (project.root / p["data_card"]).read_text(encoding="utf-8")
    assert "| raw query | query + history | teacher | teacher − query + history |" in card
    assert not (project.root / p["gate"]).exists() and not (project.root / "models/sights/sft").exists()
    fit = json.loads((project.root / p["summary"]).read_text())["stages"]["validate"]["teacher_fit"]
    assert fit["teacher"]["mean"] < fit["query_history"]["mean"]
