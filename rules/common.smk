import yaml
from pathlib import Path

from snakemake.utils import validate

from qrewrite.config import SCHEMA_PATH, validate_config
from qrewrite.io_utils import write_text_atomic
from qrewrite.paths import BASE_MODEL, STAGES, tenant_paths

validate(config, str(SCHEMA_PATH))  # fills defaults in place; fails early on a bad config
validate_config(config, source="snakemake config")  # cross-field checks (unique tenants, split sums)

TENANTS = {t["name"]: t for t in config["tenants"]}

# Apptainer image per environment (`--sdm apptainer`); built from containers/*.def.
CONTAINERS = config["containers"]

# Every command reads exactly the config Snakemake resolved (config.yaml + --configfile + --config).
# Rewritten only when its content changes; rules rerun on *params* changes, not on this file.
RESOLVED_CONFIG = "results/.config.resolved.yaml"
_resolved = yaml.safe_dump(config, allow_unicode=True, sort_keys=True)
if not Path(RESOLVED_CONFIG).exists() or Path(RESOLVED_CONFIG).read_text(encoding="utf-8") != _resolved:
    write_text_atomic(RESOLVED_CONFIG, _resolved)


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


def data_targets():
    return [tenant_paths(t)[k] for t in TENANTS for k in ("summary", "train", "val", "test")]


def model_targets():
    return [BASE_MODEL] + [tenant_paths(t)[k] for t in TENANTS for k in ("sft_model", "sft_merged", "rl_model")]


def eval_targets():
    """Per-tenant eval outputs and the HTML report (rules/eval.smk)."""
    from qrewrite.paths import REPORT_HTML, eval_paths

    return [eval_paths(t)[k] for t in TENANTS for k in ("eval_json", "examples", "plots")] + [REPORT_HTML]


def all_targets():
    return data_targets() + model_targets() + eval_targets()
