"""No silent empty outputs in the data half: a stage whose output would hold no usable row stops,
naming why and what to change, and writes nothing; a teacher that hands the questions back, or a split that
drops most rows, warns on the console and in summary.json. Real stages on a user's tenant (tests/test_onboarding.py's
acme: the fivedoctors demo re-keyed, its own column and field names), through Snakemake where the console matters.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import REPO
from qrewrite.config import validate_config
from qrewrite.errors import QrewriteError
from qrewrite.paths import tenant_paths
from test_onboarding import COLUMNS, KB_FIELDS, OWN, OWN_EXCEL, OWN_KB, own_tenant, snakemake, write_tenant_files

P = tenant_paths(OWN)


def stage(project, name: str, **kw):
    return project.stage(name, tenant=OWN, **kw)


def outputs_after(project, name: str) -> list[str]:
    """The tenant's outputs of stage `name` and later that exist."""
    later = {"teacher": ("teacher", "stats_teacher"), "validate": ("validated", "stats_validate"),
             "split": ("train", "val", "test", "stats_split"), "summarize": ("summary",)}
    order = list(later)
    keys = [k for s in order[order.index(name):] for k in later[s]]
    return [P[k] for k in keys if (project.root / P[k]).exists()]


# ---- the embedded teacher on a KB whose titles name no entity ----------------------------------------------------

def _strip_titles(project, how: str) -> None:
    path = project.root / OWN_KB
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for d in docs:
        if how == "no title field":
            del d["title"]
        else:
            d["title"] = ""
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")


@pytest.mark.slow
def test_kb_without_titles_stops_the_resolve_teacher_before_any_output(project):
    """A tenant whose KB has no titles: `snakemake data` fails at the teacher, saying on the console that the
    titles name no entity and to use `teacher: {provider: openai}`; no teacher output, nothing downstream."""
    own_tenant(project)
    _strip_titles(project, "no title field")
    proc = snakemake(project, "data", "--config", f"only={OWN}")
    assert proc.returncode != 0, proc.out[-4000:]
    for want in ("teacher.provider resolve cannot rewrite for tenant acme", "0 of 72 documents have a title",
                 "every rewrite would be the question itself", "`teacher: {provider: openai}`", OWN_KB):
        assert want in proc.out, (want, proc.out[-4000:])
    assert (project.root / P["queries"]).exists() and not outputs_after(project, "teacher")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["empty titles", "kb.fields.title null"])
def test_titles_empty_or_unmapped_stop_the_resolve_teacher(project, how):
    own_tenant(project, kb_fields={**KB_FIELDS, "title": None} if how.endswith("null") else KB_FIELDS)
    if how == "empty titles":
        _strip_titles(project, how)
    stage(project, "ingest")
    proc = stage(project, "teacher", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "`teacher: {provider: openai}`" in proc.stderr and "0 of 72 documents have a title" in proc.stderr
    assert ("tenants[].kb.fields.title is null" in proc.stderr) == how.endswith("null"), proc.stderr
    assert not outputs_after(project, "teacher")


@pytest.mark.slow
def test_titles_that_name_entities_keep_the_resolve_teacher(project):
    """The guard is about entities, not the field: the same KB with its titles rewrites the questions."""
    own_tenant(project)
    stage(project, "ingest")
    stage(project, "teacher")
    stats = json.loads((project.root / P["stats_teacher"]).read_text(encoding="utf-8"))
    assert stats["out"] == 40 and stats["unchanged_share"] < 0.5 and stats["warnings"] == [], stats


# ---- a teacher that hands the questions back ------------------------------------------------------------------------

@pytest.mark.slow
def test_teacher_handing_back_most_questions_warns_on_the_console_and_in_the_summary(project):
    """Questions that already name their product exactly (the KB titles themselves): the resolve teacher has
    nothing to resolve and returns them as they are. The data half still succeeds (the rows are valid), but
    the console and summary.json say that ≥ 90 % came back unchanged and what to do."""
    kb = [json.loads(line) for line in (REPO / "data/kb/fivedoctors.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = [{"query": d["title"], "profile": "", "history": "", "gold_doc_ids": [d["doc_id"]]} for d in kb]
    own_tenant(project)
    write_tenant_files(project.root, OWN_EXCEL, OWN_KB, COLUMNS, KB_FIELDS, queries=rows)
    proc = snakemake(project, "data", "--config", f"only={OWN}")
    assert proc.returncode == 0, proc.out[-6000:]
    assert "WARNING qrewrite.teacher: teacher resolve handed back 72 of 72 questions (100%) unchanged" in proc.out
    assert "`teacher.provider: openai`" in proc.out
    summary = json.loads((project.root / P["summary"]).read_text(encoding="utf-8"))
    assert summary["teacher"]["unchanged_share"] == 1.0
    (warning,) = summary["warnings"]
    assert warning["stage"] == "teacher" and warning["code"] == "teacher_unchanged"
    assert "72 of 72 questions (100%) unchanged" in warning["message"]
    card = json.loads((project.root / P["data_card_json"]).read_text(encoding="utf-8"))
    assert f"Warning (teacher stage): {warning['message']}" in card["known_biases"]


def test_unchanged_share_counts_after_normalisation():
    from types import SimpleNamespace

    from qrewrite.teacher.checks import unchanged_check

    queries = [{"id": str(i), "query": q} for i, q in enumerate(["那它孕妇能吃吗？", "ＤＨＡ 怎么吃", "鱼油多少钱"] * 4)]
    back = {"那它孕妇能吃吗？": "那它孕妇能吃吗", "ＤＨＡ 怎么吃": "dha怎么吃", "鱼油多少钱": "深海鱼油软胶囊多少钱"}
    teacher = SimpleNamespace(provider="openai", model="m")
    results = [{"id": q["id"], "status": "ok", "rewrite": back[q["query"]]} for q in queries]
    got = unchanged_check(queries, results, teacher)
    assert (got["unchanged"], got["unchanged_share"], got["warnings"]) == (8, 0.6667, [])
    results[2]["rewrite"] = results[5]["rewrite"] = results[8]["rewrite"] = results[11]["rewrite"] = "鱼油多少钱!"
    results.append({"id": "x", "status": "error", "rewrite": None})  # failed calls are not counted
    got = unchanged_check(queries, results, teacher)
    assert got["unchanged_share"] == 1.0 and got["warnings"][0]["code"] == "teacher_unchanged"
    assert "teacher.openai.model" in got["warnings"][0]["message"]


# ---- the split ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_split_without_training_rows_fails_naming_the_drop_reasons_and_the_setting(project):
    """A threshold no rewrite reaches (top-1 scores of this tenant top out at 0.9993): `snakemake data` stops at
    the split, naming every drop reason with its count, the setting and its value, and writes no split file and
    no summary. Before, it exited 0 with train / val / test = 0 / 0 / 0. The tenant has no gold column: with gold,
    the gold documents validate a rewrite and the threshold does not apply."""
    own_tenant(project, columns={**COLUMNS, "gold": None})
    project.update_tenant(OWN, thresholds={"top1": 1.0})
    proc = snakemake(project, "data", "--config", f"only={OWN}")
    assert proc.returncode != 0, proc.out[-4000:]
    for want in ("tenant acme: the split left no training rows (train 0 / val ", ": 40 ingested rows, ",
                 "(setting tenants[].thresholds.top1 = 1.0; the rewrites' top-1 scores: median 0.381",
                 "lower tenants[].thresholds.top1 (now 1.0", "No split file was written"):
        assert want in proc.out, (want, proc.out[-4000:])
    assert re.search(r"Not training targets \(train groups\): top1_below_threshold \d+ \(setting", proc.out)
    assert (project.root / P["validated"]).exists() and not outputs_after(project, "split")


def _split_rows(n: int, low: int) -> tuple[list, list, list]:
    """n rows of distinct questions; the first `low` rewrites score below the default threshold, 2 more retrieve
    worse than the raw query."""
    queries, teacher, validated = [], [], []
    for i in range(n):
        top1 = 0.05 if i < low else 0.9
        queries.append({"id": f"q{i}", "row": i + 2, "query": f"问题{i}", "profile": "", "history": "",
                        "gold_doc_ids": []})
        teacher.append({"id": f"q{i}", "status": "ok", "rewrite": f"改写{i}", "call_key": "k", "provider": "p",
                        "model": "m", "prompt_hash": "h"})
        validated.append({"id": f"q{i}", "rewrite_rag": {"top1": top1, "mean_top3": top1, "hits": []},
                          "original_rag": {"top1": 0.1}, "gain": -0.1 if low <= i < low + 2 else 0.1})
    return queries, teacher, validated


@pytest.fixture
def cfg_tenant():
    cfg = validate_config(yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8")))
    return cfg, cfg["tenants"][0]


def test_split_with_an_empty_test_split_fails(cfg_tenant):
    """7 question groups cut 0.8 / 0.1 / 0.1 leave the test split empty: eval could measure nothing."""
    from qrewrite.data.split import build_splits, check_splits

    cfg, tenant = cfg_tenant
    cfg["split"] = {**cfg["split"], "train": 0.8, "val": 0.1, "test": 0.1, "val_min": 0}
    rows = _split_rows(7, 0)
    _, stats = build_splits(cfg, tenant, *rows)
    with pytest.raises(QrewriteError) as err:
        check_splits(stats, tenant, rows[2])
    text = str(err.value)
    assert "an empty test split (train " in text and ": 7 ingested rows, " in text and "in 7 question group(s)" in text
    assert "at least one question group" in text


def test_split_dropping_most_rows_warns_with_the_reasons(cfg_tenant, caplog):
    from qrewrite.data.split import build_splits, check_splits

    cfg, tenant = cfg_tenant
    # the filters act on the training groups only: nearly every row's group is a training one here
    cfg["split"] = {**cfg["split"], "train": 0.9, "val": 0.05, "test": 0.05, "val_min": 0}
    rows = _split_rows(40, 30)  # 30 + 2 of 40 dropped where they fall in a training group
    splits, stats = build_splits(cfg, tenant, *rows)
    assert len(splits["train"]) == stats["splits"]["train"] > 0
    filtered = sum(stats["dropped"].values())
    reached = filtered + stats["splits"]["train"]
    assert reached == 36 and filtered / reached >= 0.5
    (warning,) = check_splits(stats, tenant, rows[2])
    assert warning["code"] == "split_dropped_most_rows"
    for want in (f"dropped {filtered} of the 36 rows of its training groups ({filtered / 36:.0%})",
                 f"top1_below_threshold {stats['dropped']['top1_below_threshold']} (setting tenants[].thresholds.top1 "
                 "= 0.1", "negative_gain ",
                 "lower tenants[].thresholds.top1"):
        assert want in warning["message"], (want, warning["message"])
    assert warning["message"] in caplog.text
    rows = _split_rows(40, 10)  # 12 of 40 at most: no warning
    assert check_splits(build_splits(cfg, tenant, *rows)[1], tenant, rows[2]) == []


# ---- ingest, validate, summarize -----------------------------------------------------------------------------------

def test_ingest_with_every_row_dropped_fails_naming_reasons_and_setting(project):
    own_tenant(project)
    project.update_tenant(OWN, thresholds={"max_query_chars": 3})
    proc = stage(project, "ingest", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for want in (OWN_EXCEL, "no usable row: all 40 data rows were dropped (query_too_long 40)",
                 "tenants[].thresholds.max_query_chars (now 3)"):
        assert want in proc.stderr, (want, proc.stderr)
    assert not (project.root / P["queries"]).exists()


@pytest.mark.slow
def test_validate_without_a_teacher_rewrite_fails(project):
    """Every teacher call failed (as the OpenAI teacher records a rejected request): validation stops."""
    own_tenant(project)
    stage(project, "ingest")
    rows = project.read_jsonl(P["queries"])
    (project.root / P["teacher"]).write_text("".join(json.dumps(
        {"id": r["id"], "provider": "openai", "model": "m", "prompt_hash": "h", "call_key": "k", "status": "error",
         "reason": "HTTP 400: bad request", "rewrite": None}) + "\n" for r in rows), encoding="utf-8")
    proc = stage(project, "validate", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "the teacher produced no rewrite: 40 rows, every one failed (HTTP 400: bad request (40))" in proc.stderr
    assert not outputs_after(project, "validate")


def test_summarize_refuses_split_stats_without_training_rows():
    from qrewrite.data.summary import build_summary

    stats = {s: {"stage": s, "in": 5, "out": 5, "dropped": {}} for s in ("ingest", "teacher", "validate")}
    stats["split"] = {"stage": "split", "in": 5, "out": 0, "dropped": {"top1_below_threshold": 5},
                      "splits": {"train": 0, "val": 0, "test": 0}}
    with pytest.raises(QrewriteError, match="the split stats report no training rows"):
        build_summary("acme", stats, {"split": "results/acme/stats/split.json"})
