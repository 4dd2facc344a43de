"""A user's own tenant, as README "Your own tenant in five minutes" adds it: an Excel and a KB made outside
data/demo (other column names, a differently named gold column, KB fields {id, title, text}), and the nine
onboarding frictions a first user met, each pinned by a test here. The section's tenant entry and commands are read
out of README.md and run as written, with a PATH that does not hold .venv/bin.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import openpyxl
import pytest
import yaml

from conftest import REPO, doc_section, fenced, run_documented, user_env
from qrewrite.config import validate_config
from qrewrite.errors import QrewriteError
from qrewrite.paths import eval_paths, tenant_paths

OWN = "acme"
OWN_EXCEL = f"data/raw/{OWN}.xlsx"  # the natural place (friction 3)
OWN_KB = f"kb/{OWN}_docs.jsonl"     # anywhere in the project
COLUMNS = {"query": "用户问题", "profile": "用户画像", "history": "对话历史", "gold": "gold_doc_ids",
           "difficulty": "difficulty"}
KB_FIELDS = {"doc_id": "id", "title": "title", "content": "text"}


def write_tenant_files(root: Path, excel: str, kb: str, columns: dict, kb_fields: dict, n: int = 40,
                       queries: list[dict] | None = None) -> None:
    """The Excel and the KB the way a user brings them, under the names `columns` / `kb_fields` give (a column
    mapped to null is not in the sheet). Content: the fivedoctors demo (or `queries`), re-keyed, so retrieval
    has something to find."""
    docs = [json.loads(l) for l in (REPO / "data/kb/fivedoctors.jsonl").read_text(encoding="utf-8").splitlines()]
    rekey = lambda i: "A" + i.split("-", 1)[1]  # noqa: E731  fd-001 -> A001
    kb_path = root / kb
    kb_path.parent.mkdir(parents=True, exist_ok=True)
    fields = {**{"doc_id": "doc_id", "title": "title", "content": "content"}, **kb_fields}
    kb_path.write_text("".join(json.dumps({fields["doc_id"]: rekey(d["doc_id"]),
                                           **({fields["title"]: d["title"]} if fields["title"] else {}),
                                           fields["content"]: d["content"]},
                                          ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    src = queries or [json.loads(l) for l in (REPO / "data/demo/fivedoctors.queries.jsonl").read_text(
        encoding="utf-8").splitlines()[:n]]
    value = {"query": lambda r: r["query"], "profile": lambda r: r["profile"], "history": lambda r: r["history"],
             "gold": lambda r: ",".join(rekey(g) for g in r["gold_doc_ids"]),
             "difficulty": lambda r: "underspecified" if r.get("underspecified") else "specified"}
    present = [k for k in value if columns.get(k)]
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "测试集"
    ws.append(["编号", *(columns[k] for k in present), "备注"])
    for i, r in enumerate(src, 1):
        ws.append([i, *(value[k](r) for k in present), ""])
    (root / excel).parent.mkdir(parents=True, exist_ok=True)
    wb.save(root / excel)


def own_tenant(project, n: int = 40, columns: dict | None = COLUMNS, kb_fields: dict | None = KB_FIELDS) -> dict:
    """Write the tenant's files (always with COLUMNS / KB_FIELDS names), add it to config.yaml (after the demo
    tenants) with the given mapping and return its config entry."""
    write_tenant_files(project.root, OWN_EXCEL, OWN_KB, COLUMNS, KB_FIELDS, n)
    cfg = project.config
    tenant = {"name": OWN, "system_prompt": cfg["tenants"][0]["system_prompt"], "raw_excel": OWN_EXCEL,
              "kb": {"path": OWN_KB, "name": f"{OWN}_kb"}}
    if columns is not None:
        tenant["columns"] = dict(columns)
    if kb_fields is not None:
        tenant["kb"]["fields"] = dict(kb_fields)
    cfg["tenants"].append(tenant)
    project.set_config(cfg)
    return tenant


def snakemake(project, *args: str, configfile: Path | None = None, timeout: float = 900):
    """The env's Snakemake by its path, as the README runs it (`.venv/bin/snakemake`), with the user's PATH."""
    exe = Path(sys.executable).parent / "snakemake"
    env = user_env()
    cmd = [str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--cores", "2"]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=timeout)
    proc.out = proc.stdout + proc.stderr
    return proc


def ingest(project, tenant: str = OWN):
    p = tenant_paths(tenant)
    return project.qrewrite("ingest", "--config", "config.yaml", "--tenant", tenant, "--out", p["queries"],
                            "--stats", p["stats_ingest"], check=False)


FIVE_MINUTES = "Your own tenant in five minutes"


def as_checkout(project) -> None:
    """The scratch project as the user's checkout after `make run`: the workflow, the package (DVC hashes its code
    deps), the DVC set-up and .venv, in a git repository."""
    for name in ("Snakefile", "rules"):
        (project.root / name).symlink_to(REPO / name)
    (project.root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "qrewrite", project.root / "qrewrite", ignore=shutil.ignore_patterns("__pycache__"))
    (project.root / ".dvc").mkdir()
    for name in (".dvc/config", ".dvcignore"):
        shutil.copy(REPO / name, project.root / name)
    subprocess.run(["git", "init", "-q"], cwd=project.root, check=True)


# ---- the whole onboarding, as README "Your own tenant in five minutes" writes it --------------------------------

@pytest.mark.slow
def test_own_tenant_in_five_minutes(project):
    """README "Your own tenant in five minutes", as written, from the project root with a PATH that does not hold
    .venv/bin: the example tenant's files (scripts/make_sights_tenant.py, a tenant of another shape than the
    demo's), `qrewrite tenant init … --write` (the entry it writes is the README's), then the config check, the dry
    run, the data half, the whole pipeline for the tenant (the training gate passes with people's rewrites as the
    teacher), dvc.yaml regenerated and DVC's data half."""
    from test_pipeline_e2e import TINY

    section = doc_section(REPO / "README.md", FIVE_MINUTES)
    (shown,) = yaml.safe_load(fenced(section, "yaml")[0])
    cfg = project.config
    # the tests' tiny model and step counts, and no model generation in eval or in RL's check against its SFT
    # parent (tests/test_pipeline_e2e.py covers both): the commands are the README's, the budget is not
    cfg.update(TINY)
    cfg["rl"] = {**cfg["rl"], "compare_with_parent": False}
    cfg["eval"].update({"candidates": [{"name": "raw", "kind": "raw"}, {"name": "teacher", "kind": "teacher"}],
                        "compare": [["teacher", "raw"]], "headline": ["teacher"], "max_rows": 3})
    project.set_config(cfg)
    as_checkout(project)
    (project.root / "scripts").symlink_to(REPO / "scripts")
    make_files = re.search(r"`(\.venv/bin/python scripts/make_sights_tenant\.py)`", section).group(1)
    commands = fenced(section, "bash")
    assert len(commands) == 3 and "qrewrite tenant init sights" in commands[0]
    assert ".venv/bin/snakemake --cores 2 data --config only=sights" in commands[1]
    env = user_env()
    run_documented(make_files, project.root, env)
    out = run_documented(commands[0], project.root, env)
    # the entry `tenant init --write` added is the one the README shows (its proposals, the teacher that fits)
    written = next(t for t in project.config["tenants"] if t["name"] == "sights")
    for key in ("language", "raw_excel", "columns", "teacher", "student"):
        assert written[key] == shown[key], (key, written[key], shown[key])
    assert written["kb"]["fields"] == shown["kb"]["fields"] and written["kb"]["path"] == shown["kb"]["path"]
    assert "resolve" in out and "column" in out, out[-3000:]
    for block in commands[1:]:
        run_documented(block, project.root, env)

    name = "sights"
    p = tenant_paths(name)
    summary = json.loads((project.root / p["summary"]).read_text(encoding="utf-8"))
    assert summary["stages"]["ingest"]["with_gold"] == 150 and summary["stages"]["ingest"]["gold_ids_not_in_kb"] == 0
    fit = summary["stages"]["validate"]["teacher_fit"]
    assert fit["teacher"]["mean"] >= fit["query_history"]["mean"], fit  # the gate let it through: people's rewrites
    assert json.loads((project.root / p["gate"]).read_text(encoding="utf-8"))["passed"] is True
    assert summary["splits"]["train"] > 0 and summary["warnings"] == [], summary
    assert (project.root / eval_paths(name)["eval_json"]).is_file() and (project.root / f"models/{name}/rl").is_dir()
    assert f"summarize@{name}" in (project.root / "dvc.lock").read_text(encoding="utf-8")
    # only the selected tenant ran; the demo tenants stayed in the config every command read
    assert not (project.root / "results/fivedoctors").exists() and not (project.root / "data/raw/fivedoctors.xlsx").exists()
    resolved = yaml.safe_load((project.root / "results/.config.resolved.yaml").read_text(encoding="utf-8"))
    assert [t["name"] for t in resolved["tenants"]] == ["fivedoctors", "chengla", name] and "only" not in resolved
    # the demo tenants, afterwards, are a separate selection and leave the new tenant alone
    again = snakemake(project, "-n", "-p", "data", "--config", "only=chengla")
    assert again.returncode == 0 and f"--tenant {name}" not in again.out and "--tenant chengla" in again.out


# ---- 1. KB field mapping --------------------------------------------------------------------------------------

def test_kb_with_other_field_names_fails_naming_file_row_field_and_fields_found(project):
    own_tenant(project, kb_fields=None)
    proc = ingest(project)
    assert proc.returncode == 2, proc.stderr
    for want in (OWN_KB, "row 1", "missing field 'doc_id'", "fields found: ['id', 'title', 'text']",
                 "tenants[].kb.fields.doc_id"):
        assert want in proc.stderr, (want, proc.stderr)
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_kb_field_mapping_is_used_by_every_kb_reader(project, monkeypatch):
    own_tenant(project)
    assert ingest(project).returncode == 0
    from qrewrite.config import load_config, tenant_config
    from qrewrite.kb import tenant_kb

    monkeypatch.chdir(project.root)
    tenant = tenant_config(load_config("config.yaml"), OWN)
    docs = tenant_kb(tenant)
    assert docs[0].doc_id == "A001" and docs[0].title and docs[0].content
    p = tenant_paths(OWN)
    proc = project.qrewrite("teacher", "--config", "config.yaml", "--tenant", OWN, "--queries", p["queries"],
                            "--out", p["teacher"], "--stats", p["stats_teacher"], "--no-progress")
    assert proc.returncode == 0


@pytest.mark.parametrize("fields,ok", [
    ({}, True), ({"doc_id": "id", "content": "text"}, True), ({"title": None}, True),
    ({"id": "doc_id"}, False), ({"doc_id": ""}, False), ({"content": None}, False)])
def test_kb_fields_are_schema_validated(fields, ok):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    cfg["tenants"][0]["kb"]["fields"] = fields
    if ok:
        got = validate_config(cfg)["tenants"][0]["kb"]["fields"]
        assert got == {"doc_id": "doc_id", "title": "title", "content": "content", **fields}
    else:
        with pytest.raises(QrewriteError, match=r"tenants\.0\.kb\.fields"):
            validate_config(cfg)


# ---- 2. a configured column missing from the Excel ------------------------------------------------------------

def test_misnamed_gold_column_is_an_error_naming_the_columns_found(project):
    own_tenant(project, columns={**COLUMNS, "gold": "相关文档"})  # the default name; the sheet says gold_doc_ids
    proc = ingest(project)
    assert proc.returncode == 2, proc.stderr
    for want in (OWN_EXCEL, "missing column '相关文档' (gold)", "columns found:", "'gold_doc_ids'",
                 "tenants[].columns.gold", "null"):
        assert want in proc.stderr, (want, proc.stderr)
    assert not (project.root / tenant_paths(OWN)["queries"]).exists()


def test_optional_columns_may_be_absent_only_when_configured_null(project):
    """profile, history, gold (and difficulty) are optional: null says the sheet has no such column."""
    own_tenant(project, columns={**COLUMNS, "profile": "画像"})
    proc = ingest(project)
    assert proc.returncode == 2 and "missing column '画像' (profile)" in proc.stderr
    project.update_tenant(OWN, columns={"profile": None, "history": None, "gold": None, "difficulty": None})
    assert ingest(project).returncode == 0
    rows = project.read_jsonl(tenant_paths(OWN)["queries"])
    stats = json.loads((project.root / tenant_paths(OWN)["stats_ingest"]).read_text())
    assert stats["in"] == 40 and rows and stats["with_gold"] == 0  # (same query, no context: duplicates)
    assert all(r["profile"] == r["history"] == "" and "difficulty" not in r for r in rows)


# ---- 3. a user tenant's raw_excel in data/raw/ ------------------------------------------------------------------

def test_user_tenant_with_raw_excel_in_data_raw_plans_without_build_excel(project):
    own_tenant(project)
    proc = snakemake(project, "-n", "-p", "data")
    assert proc.returncode == 0, proc.out[-4000:]
    assert "InputFunctionException" not in proc.out
    assert f"--tenant {OWN}" in proc.out and f"build-excel --config results/.config.resolved.yaml --tenant {OWN}" \
        not in proc.out
    assert "build-excel --config results/.config.resolved.yaml --tenant fivedoctors" in proc.out


# ---- 4. make clean and .gitignore keep user data ----------------------------------------------------------------

def _makefile_demo_excel() -> list[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return re.search(r"^DEMO_EXCEL\s*:=\s*(.*)$", text, flags=re.M).group(1).split()


def test_make_clean_deletes_only_generated_demo_excel(tmp_path):
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    raw = tmp_path / "data/raw"
    raw.mkdir(parents=True)
    for name in ("fivedoctors.xlsx", "chengla.xlsx", f"{OWN}.xlsx", f"{OWN}.xlsx.dvc"):
        (raw / name).write_bytes(b"x")
    (tmp_path / "results/t").mkdir(parents=True)
    (tmp_path / "cache/teacher").mkdir(parents=True)
    (tmp_path / "cache/teacher/paid.json").write_text("{}")  # a paid teacher call: make clean keeps it
    proc = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in raw.iterdir()) == [f"{OWN}.xlsx", f"{OWN}.xlsx.dvc"]
    assert not (tmp_path / "results").exists() and (tmp_path / "cache/teacher/paid.json").is_file()
    proc = subprocess.run(["make", "clean-all"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not (tmp_path / "cache").exists(), proc.stderr


def test_demo_excel_list_matches_config_and_gitignore_hides_only_it():
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    demo = sorted(t["raw_excel"] for t in cfg["tenants"] if t.get("demo_source"))
    assert sorted(_makefile_demo_excel()) == demo

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 0

    assert all(ignored(p) for p in demo)
    assert not ignored(OWN_EXCEL) and not ignored(f"{OWN_EXCEL}.dvc")


# ---- 5. dvc.yaml after adding a tenant ---------------------------------------------------------------------------

@pytest.mark.slow
def test_stale_dvc_yaml_error_gives_the_exact_command_that_fixes_it(project):
    shutil.copy(REPO / "dvc.yaml", project.root / "dvc.yaml")
    own_tenant(project)
    proc = project.qrewrite("dvc-yaml", "--check", check=False)
    assert proc.returncode == 2 and "dvc.yaml is stale" in proc.stderr
    fix = re.search(r"regenerate it with `([^`]+)`", proc.stderr)
    assert fix, proc.stderr
    cmd = shlex.split(fix.group(1))
    assert cmd[0] == "qrewrite"
    project.qrewrite(*cmd[1:])
    assert project.qrewrite("dvc-yaml", "--check").returncode == 0
    assert f"{OWN}:" in (project.root / "dvc.yaml").read_text(encoding="utf-8")
    assert "qrewrite dvc-yaml" in (REPO / "README.md").read_text(encoding="utf-8")


# ---- 6. one tenant -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_only_selects_tenants_without_changing_the_tenant_list(project):
    proc = snakemake(project, "-n", "-p", "data", "--config", "only=chengla")
    assert proc.returncode == 0, proc.out[-4000:]
    assert "--tenant chengla" in proc.out and "--tenant fivedoctors" not in proc.out
    both = snakemake(project, "-n", "-p", "data", "--config", "only=chengla,fivedoctors")
    assert "--tenant chengla" in both.out and "--tenant fivedoctors" in both.out
    bad = snakemake(project, "-n", "data", "--config", "only=nope")
    assert bad.returncode != 0 and "unknown tenant(s) ['nope']" in bad.out and "fivedoctors, chengla" in bad.out


@pytest.mark.slow
def test_a_configfile_that_replaces_the_tenant_list_says_so(project):
    cfg = project.config
    cfg["tenants"] = cfg["tenants"][1:]
    one = project.root / "one.yaml"
    one.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    proc = snakemake(project, "-n", "data", configfile=one)
    assert proc.returncode == 0, proc.out[-3000:]
    assert "replaced the tenant list" in proc.out and "fivedoctors" in proc.out and "only=NAME" in proc.out
    assert "replaced the tenant list" not in snakemake(project, "-n", "data").out


# ---- 7. a dry run writes nothing ---------------------------------------------------------------------------------

def test_dry_run_writes_no_resolved_config(project):
    proc = snakemake(project, "-n", "data")
    assert proc.returncode == 0, proc.out[-3000:]
    assert not (project.root / "results").exists(), list((project.root / "results").rglob("*"))


# ---- 8. judge rubric per tenant; threshold drops per difficulty ---------------------------------------------------

RUBRIC = "好的改写要写出用户所指的课程或产品全称，并保留用户关心的方面。"


def test_judge_rubric_replaces_only_the_criteria():
    from qrewrite.reward.judge_openai import JUDGE_SYSTEM, judge_messages

    default = judge_messages("问", "画像", "历史", "改写")[0]["content"]
    assert default == JUDGE_SYSTEM and "names the product or course" in default
    custom = judge_messages("问", "画像", "历史", "改写", RUBRIC)[0]["content"]
    assert custom.startswith(RUBRIC) and "names the product or course" not in custom
    assert custom.endswith(JUDGE_SYSTEM[JUDGE_SYSTEM.index("\n\nScores:"):])


def test_tenant_judge_rubric_reaches_the_openai_judge(fake_openai, monkeypatch, tmp_path):
    import asyncio

    from qrewrite.reward.scorer import RewardScorer

    fake_openai.script(replies={"<data>": '{"score": 4, "reason": "ok"}'})
    monkeypatch.setenv("QREWRITE_TEST_JUDGE_KEY", "k")
    monkeypatch.chdir(REPO)  # the tenant's KB path is relative to the project
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    cfg["tenants"][1]["judge_rubric"] = RUBRIC
    cfg["reward"] = {"cache_dir": str(tmp_path / "reward-cache"),
                     "judge": {"provider": "openai", "openai": {"base_url": fake_openai.url, "model": "judge-model",
                                                                "api_key_env": "QREWRITE_TEST_JUDGE_KEY"}}}
    cfg = validate_config(cfg)
    scorer = RewardScorer(cfg, cfg["tenants"][1])
    assert scorer.judge.rubric == RUBRIC

    async def judge_once():
        try:
            return await scorer.judge.judge("雅思课多少钱", "", "", "橙啦雅思课程价格")
        finally:
            await scorer.judge.aclose()

    verdict = asyncio.run(judge_once())
    assert verdict.score == 4.0
    # the server logs a hash of the messages it got: those of the tenant's rubric
    from fake_openai_server import prompt_key
    from qrewrite.reward.judge_openai import judge_messages

    sent = fake_openai.requests()[-1]["key"]
    assert sent == prompt_key({"messages": judge_messages("雅思课多少钱", "", "", "橙啦雅思课程价格", RUBRIC)})
    assert RewardScorer(cfg, cfg["tenants"][0]).judge.rubric is None


def test_split_reports_threshold_drop_share_per_difficulty():
    from qrewrite.data.split import build_splits
    from qrewrite.data.summary import build_summary

    cfg = validate_config(yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8")))
    tenant = cfg["tenants"][0]  # thresholds.top1 0.1
    queries, teacher, validated = [], [], []
    for i in range(10):
        level = "underspecified" if i < 4 else "specified"
        top1 = 0.05 if i < 3 else 0.9  # 3 of the 4 hard rows fall below the threshold, no easy row does
        qid = f"q{i}"
        queries.append({"id": qid, "row": i + 2, "query": f"问题{i}", "profile": "", "history": "",
                        "gold_doc_ids": [], "difficulty": level})
        teacher.append({"id": qid, "status": "ok", "rewrite": f"改写{i}", "call_key": "k", "provider": "prf",
                        "model": "m", "prompt_hash": "h"})
        validated.append({"id": qid, "rewrite_rag": {"top1": top1, "mean_top3": top1, "hits": []},
                          "original_rag": {"top1": 0.1}, "gain": 0.1})
    _, stats = build_splits(cfg, tenant, queries, teacher, validated)
    assert stats["by_difficulty"] == {
        "specified": {"in": 6, "top1_below_threshold": 0, "top1_drop_share": 0.0, "dropped": 0, "drop_share": 0.0},
        "underspecified": {"in": 4, "top1_below_threshold": 3, "top1_drop_share": 0.75, "dropped": 3,
                           "drop_share": 0.75}}
    for q in queries:
        del q["difficulty"]  # a tenant without a difficulty column: one bucket
    _, stats = build_splits(cfg, tenant, queries, teacher, validated)
    assert list(stats["by_difficulty"]) == ["all"] and stats["by_difficulty"]["all"]["top1_below_threshold"] == 3
    stage = lambda s, n, o: {"stage": s, "in": n, "out": o, "dropped": {"x": n - o} if n > o else {}}  # noqa: E731
    summary = build_summary("t", {"ingest": stage("ingest", 10, 10), "validate": {
        **stage("validate", 10, 10), "hit_at_1": {}, "rewrite_beats_original_share": 0.5}, "teacher": {
        **stage("teacher", 10, 10), "provider": "prf", "model": "m", "cache_hits": 0, "new_calls": 0,
        "failed_calls": 0, "tokens": 0, "cost_usd": 0}, "split": stats},
        {"judge": {"derived": {"auc": None, "by_failure": {}}}, "reward": None, "refusal": "no derived labels"})
    assert summary["drops_by_difficulty"] == stats["by_difficulty"]



def test_demo_excel_carries_difficulty_and_ingest_keeps_it(project):
    """The demo tenants' Excel has a 难度 column from the source's `underspecified` flag (config.yaml maps it)."""
    project.keep_queries("fivedoctors", 30)
    project.stage("build-excel")
    ws = openpyxl.load_workbook(project.root / "data/raw/fivedoctors.xlsx").active
    header = [c.value for c in ws[1]]
    assert header == ["问题", "用户画像", "历史摘要", "相关文档", "难度"]
    src = project.read_jsonl("data/demo/fivedoctors.queries.jsonl")
    assert [ws.cell(r, 5).value for r in range(2, ws.max_row + 1)] == [
        "underspecified" if r["underspecified"] else "specified" for r in src]
    project.stage("ingest")
    assert {r["difficulty"] for r in project.read_jsonl(tenant_paths("fivedoctors")["queries"])} == {
        "underspecified", "specified"}

# ---- 9. a rule's error reaches the console ---------------------------------------------------------------------

@pytest.mark.slow
def test_rule_error_reaches_the_console_and_the_log(project):
    """A real snakemake run on a broken input: the stage's own message (file, column, hint) is in its log and on
    the console, not only Snakemake's "Error in rule ingest" / CalledProcessError."""
    own_tenant(project, columns={**COLUMNS, "query": "问句"})  # the sheet's column is 用户问题
    proc = snakemake(project, "data", "--config", f"only={OWN}")
    assert proc.returncode != 0
    log = (project.root / f"logs/{OWN}/ingest.log").read_text(encoding="utf-8")
    for text in (log, proc.out):
        assert "missing column '问句' (query)" in text and "tenants[].columns.query" in text, text[-3000:]
    assert "Traceback" not in log
