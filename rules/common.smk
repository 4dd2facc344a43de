import sys

import yaml
from pathlib import Path

from snakemake.utils import validate

from qrewrite.config import SCHEMA_PATH, selected_tenants, validate_config
from qrewrite.io_utils import write_text_atomic
from qrewrite.eval.candidates import deploy_candidate, model_path
from qrewrite.paths import BASE_MODEL, REPORT_HTML, STAGES, deploy_json, eval_paths, tenant_paths

validate(config, str(SCHEMA_PATH))  # fills defaults in place; fails early on a bad config
validate_config(config, source="snakemake config")  # cross-field checks (unique tenants, split sums, eval names)

TENANTS = {t["name"]: t for t in config["tenants"]}
# The tenants whose targets `snakemake` builds: all, or those named by `--config only=NAME[,NAME]`.
# The tenant list itself stays whole, so explicit targets of any tenant keep working.
SELECTED = selected_tenants(config)
# Demo tenants build their raw Excel from demo_source (rule build_excel); every other tenant supplies it.
DEMO_TENANTS = [n for n, t in TENANTS.items() if t["demo_source"]]

# `--configfile` replaces config.yaml's tenant list (Snakemake merges lists by replacing them): say so,
# so a one-tenant --configfile does not silently drop the other tenants.
if workflow.overwrite_configfiles and Path("config.yaml").exists():
    _base = [t.get("name") for t in (yaml.safe_load(Path("config.yaml").read_text(encoding="utf-8")) or {}).get("tenants") or []]
    _dropped = [n for n in _base if n not in TENANTS]
    if _dropped:
        print(f"qrewrite: note: --configfile replaced the tenant list of config.yaml; not in this run: "
              f"{', '.join(_dropped)}. To run some tenants of config.yaml, use --config only=NAME[,NAME].",
              file=sys.stderr)

# Apptainer image per environment (`--sdm apptainer`); built from containers/*.def.
CONTAINERS = config["containers"]
# The same environments for `--sdm conda`, by container name (paths relative to rules/, as Snakemake reads them).
CONDA_ENVS = {"cpu": "../envs/data.yaml", "swift": "../envs/swift.yaml", "verl": "../envs/verl.yaml"}

# Every command reads exactly the config Snakemake resolved (config.yaml + --configfile + --config), less
# the run-time selection `only`. Written when the run starts (onstart: never on a dry run, `-n`), and only
# when its content changes; rules rerun on *params* changes, not on this file.
RESOLVED_CONFIG = "results/.config.resolved.yaml"


onstart:
    _resolved = yaml.safe_dump({k: v for k, v in config.items() if k != "only"}, allow_unicode=True,
                               sort_keys=True)
    if not Path(RESOLVED_CONFIG).exists() or Path(RESOLVED_CONFIG).read_text(encoding="utf-8") != _resolved:
        write_text_atomic(RESOLVED_CONFIG, _resolved)


# Appended to a rule's shell command that sends its output to {log}: when the command fails, the log's
# tail (the stage's own error message and hint) is printed on the console too, under Snakemake's error.
SHOW_LOG_ON_ERROR = " || {{ rc=$?; echo '--- tail of {log}:' >&2; tail -n 40 {log} >&2; exit $rc; }}"


def logged(cmd, launch=""):
    """Shell command `cmd` (which sends its output to {log}), run through `launch`, with SHOW_LOG_ON_ERROR."""
    return f"{launch}{cmd}{SHOW_LOG_ON_ERROR}"


wildcard_constraints:
    tenant="|".join(TENANTS),


def P(key):
    """Input/output function: the artifact path `key` for the rule's tenant (layout in qrewrite/paths.py)."""
    return lambda wc: tenant_paths(wc.tenant)[key]


def T(key):
    """Output path pattern for artifact `key`, with the {tenant} wildcard."""
    return tenant_paths("{tenant}")[key]


def tenant_cfg(wc):
    return TENANTS[wc.tenant]


def raw_excel(wc):
    return TENANTS[wc.tenant]["raw_excel"]


def optional(key):
    """Input function: the tenant's config-given file `key` (gold_set, red_team), or no input when it has none."""
    return lambda wc: TENANTS[wc.tenant][key] or []


def data_targets():
    return [tenant_paths(t)[k] for t in SELECTED for k in ("summary", "train", "val", "test", "data_card")]


def model_targets():
    return [BASE_MODEL] + [tenant_paths(t)[k] for t in SELECTED for k in ("sft_model", "sft_merged", "rl_model")]


def eval_targets():
    """Per-tenant eval outputs and the HTML report (rules/eval.smk)."""
    per_tenant = [eval_paths(t)[k] for t in SELECTED for k in ("eval_json", "examples", "plots")]
    return per_tenant + ([REPORT_HTML] if len(SELECTED) == len(TENANTS) else [])  # the report covers every tenant


def all_targets():
    return data_targets() + model_targets() + eval_targets()


# --- eval (rules/eval.smk): candidates are config entries (eval.candidates) ------------------------------

EVAL = config["eval"]
CANDIDATES = {c["name"]: c for c in EVAL["candidates"]}
MODEL_CANDIDATES = [n for n, c in CANDIDATES.items() if c["kind"] == "model"]
OTHER_CANDIDATES = [n for n, c in CANDIDATES.items() if c["kind"] != "model"]


def E(key):
    """Eval artifact path pattern for `key`, with the {tenant} wildcard (layout in qrewrite/paths.py)."""
    return eval_paths("{tenant}")[key]


def eval_model(wc):
    return model_path(CANDIDATES[wc.candidate], TENANTS[wc.tenant])


def eval_rewrites_of(wc):
    return [eval_paths(wc.tenant)["rewrites"].format(candidate=c) for c in CANDIDATES]


# --- deploy (rules/deploy.smk): the serving check of deploy.candidate's model, outside `all` ----------------

DEPLOY = config["deploy"]


def deploy_targets():
    return [deploy_json(t) for t in SELECTED]


def deploy_model(wc):
    return model_path(deploy_candidate(config), TENANTS[wc.tenant])


def deploy_rewrites(wc):
    return eval_paths(wc.tenant)["rewrites"].format(candidate=deploy_candidate(config)["name"])
