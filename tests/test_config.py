"""config.yaml: schema defaults, cross-field checks, `qrewrite config`, and agreement with Snakemake's validate."""

from __future__ import annotations

import copy

import pytest
import yaml

from qrewrite.config import SCHEMA_PATH, load_config, validate_config
from qrewrite.errors import QrewriteError
from conftest import REPO


def tenant(name: str = "acme", **extra) -> dict:
    return {"name": name, "system_prompt": "rewrite the query", "raw_excel": f"data/raw/{name}.xlsx",
            "kb": {"path": f"data/kb/{name}.jsonl"}, **extra}


MINIMAL = {"tenants": [tenant()]}


def get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[int(part)] if isinstance(cfg, list) else cfg[part]
    return cfg


DEFAULTS = [
    ("teacher.provider", "resolve"),
    ("teacher.concurrency", 10),
    ("teacher.cache_dir", "cache/teacher"),
    ("teacher.openai.temperature", 0.3),
    ("teacher.openai.max_tokens", 200),
    ("teacher.openai.reasoning_max_tokens", 2048),
    ("teacher.openai.reasoning_effort", "minimal"),
    ("teacher.openai.family", "auto"),
    ("teacher.mode", "sync"),
    ("teacher.batch.completion_window", "24h"),
    ("teacher.batch.price_share", 0.5),
    ("teacher.openai.model", "gpt-5"),
    ("teacher.openai.base_url", None),
    ("teacher.openai.api_key_env", "OPENAI_API_KEY"),
    ("teacher.openai.max_retries", 5),
    ("rag.provider", "local"),
    ("rag.top_k", 5),
    ("rag.http.fields.recall_path", "data.recall"),
    ("split.seed", 42),
    ("split.train", 0.8),
    ("split.val", 0.1),
    ("split.test", 0.1),
    ("tenants.0.language", "zh"),
    ("tenants.0.sheet", None),
    ("tenants.0.demo_source", None),
    ("tenants.0.kb.name", "default"),
    ("tenants.0.columns.query", "问题"),
    ("tenants.0.columns.profile", "用户画像"),
    ("tenants.0.columns.history", "历史摘要"),
    ("tenants.0.columns.gold", "相关文档"),
    ("tenants.0.thresholds.top1", 0.1),
    ("tenants.0.thresholds.require_gain", True),
    ("tenants.0.thresholds.max_query_chars", 500),
]


@pytest.mark.parametrize("key,want", DEFAULTS, ids=[k for k, _ in DEFAULTS])
def test_defaults_filled(key, want):
    assert get(validate_config(MINIMAL), key) == want


def test_validate_does_not_mutate_input_and_defaults_are_not_shared():
    raw = {"tenants": [tenant("a"), tenant("b")]}
    before = copy.deepcopy(raw)
    cfg = validate_config(raw)
    assert raw == before
    cfg["tenants"][0]["thresholds"]["top1"] = 0.9
    cfg["tenants"][0]["columns"]["query"] = "Q"
    assert cfg["tenants"][1]["thresholds"]["top1"] == 0.1
    assert cfg["tenants"][1]["columns"]["query"] == "问题"
    assert validate_config(raw)["tenants"][0]["thresholds"]["top1"] == 0.1


def test_explicit_values_win_over_defaults():
    raw = {"tenants": [tenant(thresholds={"top1": 0.75}, columns={"query": "Question"})],
           "teacher": {"provider": "openai", "openai": {"model": "deepseek-chat", "temperature": 0.0}},
           "split": {"seed": 7}}
    cfg = validate_config(raw)
    assert cfg["tenants"][0]["thresholds"] == {"top1": 0.75, "require_gain": True, "max_query_chars": 500}
    assert cfg["tenants"][0]["columns"]["query"] == "Question"
    assert cfg["tenants"][0]["columns"]["profile"] == "用户画像"
    assert cfg["teacher"]["openai"]["temperature"] == 0.0 and cfg["teacher"]["openai"]["max_tokens"] == 200
    assert cfg["split"] == {"seed": 7, "train": 0.8, "val": 0.1, "test": 0.1, "val_min": 0}


SPLITS = [
    ({}, True),
    ({"train": 0.8, "val": 0.1, "test": 0.1}, True),
    ({"train": 0.7, "val": 0.2, "test": 0.1}, True),
    ({"train": 1.0, "val": 0.0, "test": 0.0}, True),
    ({"train": 0.6, "val": 0.2, "test": 0.2}, True),
    ({"train": 0.9}, False),  # 0.9 + default 0.1 + 0.1
    ({"train": 0.8, "val": 0.1, "test": 0.2}, False),
    ({"train": 0.5, "val": 0.1, "test": 0.1}, False),
    ({"train": 0.0, "val": 0.0, "test": 0.0}, False),
]


@pytest.mark.parametrize("split,ok", SPLITS, ids=[f"{s}-{'ok' if ok else 'bad'}" for s, ok in SPLITS])
def test_split_fractions_must_sum_to_one(split, ok):
    raw = {**MINIMAL, "split": split}
    if ok:
        assert validate_config(raw)["split"]["train"] == split.get("train", 0.8)
    else:
        with pytest.raises(QrewriteError, match=r"must sum to 1") as exc:
            validate_config(raw)
        assert exc.value.hint


@pytest.mark.parametrize("names,dupes", [(["a", "a"], ["a"]), (["a", "b", "a", "b", "c"], ["a", "b"])])
def test_duplicate_tenant_names_rejected(names, dupes):
    with pytest.raises(QrewriteError, match="tenant names must be unique") as exc:
        validate_config({"tenants": [tenant(n) for n in names]})
    assert str(dupes) in str(exc.value)


VIOLATIONS = [
    ({"teacher": {"provider": "gpt"}}, "teacher.provider", "'gpt' is not one of"),
    ({"teachr": {}}, "(top level)", "'teachr' was unexpected"),
    ({"tenants": []}, "tenants", "should be non-empty"),
    ({"tenants": [tenant("Bad Name")]}, "tenants.0.name", "does not match"),
    ({"tenants": [tenant(thresholds={"top1": 1.5})]}, "tenants.0.thresholds.top1", "greater than the maximum"),
    ({"tenants": [tenant(columns={"question": "Q"})]}, "tenants.0.columns", "'question' was unexpected"),
    ({"tenants": [{k: v for k, v in tenant().items() if k != "kb"}]}, "tenants.0", "'kb' is a required property"),
    ({"rag": {"top_k": 0}}, "rag.top_k", "less than the minimum"),
    ({"split": {"train": "0.8"}}, "split.train", "is not of type 'number'"),
    ({"teacher": {"openai": {"api_key": "sk-secret"}}}, "teacher.openai", "'api_key' was unexpected"),
]


@pytest.mark.parametrize("patch,path,message", VIOLATIONS, ids=[p for _, p, _ in VIOLATIONS])
def test_schema_violation_names_key_path(patch, path, message):
    with pytest.raises(QrewriteError) as exc:
        validate_config({**MINIMAL, **patch}, source="my.yaml")
    text = str(exc.value)
    assert f"config key {path}:" in text and message in text and "file my.yaml" in text, text
    assert exc.value.hint and "config.schema.yaml" in exc.value.hint


def test_load_config_repo_file():
    cfg = load_config(REPO / "config.yaml")
    assert [t["name"] for t in cfg["tenants"]] == ["fivedoctors", "chengla"]
    assert cfg["teacher"]["openai"]["model"] == "gpt-5" and cfg["teacher"]["openai"]["reasoning_effort"] == "minimal"


@pytest.mark.parametrize("which", ["repo", "minimal"])
def test_cli_config_prints_filled_config(project, which):
    if which == "minimal":
        project.set_config(MINIMAL)
    proc = project.qrewrite("config", "--config", "config.yaml")
    printed = yaml.safe_load(proc.stdout)
    assert printed == load_config(project.config_path)
    assert printed["teacher"]["openai"]["temperature"] == 0.3
    assert printed["tenants"][0]["thresholds"]["top1"] == 0.1
    # the schema's default split, or config.yaml's (the demo tenants give test more rows)
    assert printed["split"] == ({"seed": 42, "train": 0.8, "val": 0.1, "test": 0.1, "val_min": 0} if which == "minimal"
                                else {"seed": 42, "train": 0.55, "val": 0.15, "test": 0.3, "val_min": 30})
    assert proc.stderr.strip() == ""


def _configs():
    return {
        "minimal": MINIMAL,
        "repo": yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8")),
        "partial": {"tenants": [tenant("a", thresholds={"top1": 0.5}), tenant("b", columns={"gold": None})],
                    "teacher": {"provider": "openai", "openai": {"base_url": "http://x/v1"}},
                    "rag": {"provider": "http", "http": {"fields": {"score": "score"}}}, "split": {"seed": 1}},
    }


@pytest.mark.parametrize("name", ["minimal", "repo", "partial"])
def test_snakemake_validate_fills_the_same_defaults(name):
    from snakemake.utils import validate

    raw = _configs()[name]
    ours = validate_config(raw)
    theirs = copy.deepcopy(raw)
    validate(theirs, str(SCHEMA_PATH))
    assert theirs == ours
    # and cross-field checks still pass on what Snakemake produced (rules/common.smk runs both)
    assert validate_config(theirs) == ours


def test_snakemake_validate_rejects_what_we_reject():
    from snakemake.utils import validate

    bad = {**MINIMAL, "teacher": {"provider": "gpt"}}
    with pytest.raises(Exception, match="gpt"):
        validate(copy.deepcopy(bad), str(SCHEMA_PATH))
    with pytest.raises(QrewriteError):
        validate_config(bad)


def test_a_tenant_names_its_own_teacher():
    """tenants[].teacher: a tenant with people's rewrites (provider column) beside tenants the global teacher
    serves; the column check names only the tenants whose own teacher is the column."""
    from qrewrite.config import tenant_teacher
    from qrewrite.teacher.stage import make_teacher

    people = tenant("people", columns={"rewrite": "参考改写"}, teacher={"provider": "column"})
    cfg = validate_config({"tenants": [tenant(), people]})
    assert [tenant_teacher(cfg, t)["provider"] for t in cfg["tenants"]] == ["resolve", "column"]
    assert tenant_teacher(cfg, cfg["tenants"][1])["cache_dir"] == cfg["teacher"]["cache_dir"]  # the rest: global
    assert make_teacher(cfg, cfg["tenants"][1]).column == "参考改写"
    # the teacher rule's `teacher` param is the tenant's own: unchanged for a tenant without one (adding the
    # setting reruns nothing), the column for the other (changing it reruns that tenant only)
    from qrewrite.workflow.stages import param_value

    assert param_value(cfg, "teacher", cfg["tenants"][0]) == cfg["teacher"]
    assert param_value(cfg, "teacher", cfg["tenants"][1]) == {**cfg["teacher"], "provider": "column"}
    with pytest.raises(QrewriteError, match=r"tenants \['acme'\], which have no columns.rewrite"):
        validate_config({"tenants": [tenant(teacher={"provider": "column"}), people]})
    with pytest.raises(QrewriteError, match=r"tenants\.0\.teacher"):
        validate_config({"tenants": [tenant(teacher={"model": "gpt-5"})]})
