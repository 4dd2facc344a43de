import json
import sys

import yaml
from pathlib import Path

from snakemake.utils import validate

from qrewrite.config import SCHEMA_PATH, check_before_schema, selected_tenants, validate_config
from qrewrite.envs import own_bin_first_on_path
from qrewrite.errors import QrewriteError
from qrewrite.hardware import speed_note
from qrewrite.io_utils import write_text_atomic
from qrewrite.paths import demo_excel
from qrewrite.secret import redact_values
from qrewrite.workflow.stages import (DIRECTORIES, STAGES, candidates, command, flat, job_files, job_threads, jobs,
                                      named_files, param_value, resolve)

# Every rule runs plain `qrewrite` (a container's or conda env's own one there); on the host, the one next to the
# Python running Snakemake comes first on PATH, so `.venv/bin/snakemake` needs no .venv/bin on PATH.
own_bin_first_on_path()

# first: a key pasted where an env var's name belongs (validate's message would quote it), a base_model not named
check_before_schema(config, source="snakemake config")
validate(config, str(SCHEMA_PATH))  # fills defaults in place; fails early on a bad config
validate_config(config, source="snakemake config")  # cross-field checks (unique tenants, split sums, eval names)

TENANTS = {t["name"]: t for t in config["tenants"]}
# The tenants whose targets `snakemake` builds: all, or those named by `--config only=NAME[,NAME]`.
# The tenant list itself stays whole, so explicit targets of any tenant keep working.
SELECTED = selected_tenants(config)
# Threads of a training / generation job: train.threads, or with `auto` --cores shared among the selected
# tenants (make run: 2 cores, 2 tenants -> 1 each, the two tenants' chains side by side). The Slurm profile's
# set-threads overrides it per rule.
TRAIN_THREADS = job_threads(config["train"]["threads"], workflow.cores, len(SELECTED))
# Rule build_excel writes a demo tenant's Excel (tenants[].demo_source) at one path pattern, data/raw/<name>.xlsx.
for _t in TENANTS.values():
    if _t["demo_source"] and _t["raw_excel"] != demo_excel(_t["name"]):
        raise QrewriteError(f"tenant {_t['name']}: a demo tenant's raw Excel is built at {demo_excel(_t['name'])}, "
                            f"not {_t['raw_excel']}", file="snakemake config",
                            hint=f"set raw_excel: {demo_excel(_t['name'])}, or demo_source: null for your own Excel")
CANDIDATES = {c["name"]: c for c in config["eval"]["candidates"]}

# `--configfile` replaces config.yaml's tenant list (Snakemake merges lists by replacing them): say so,
# so a one-tenant --configfile does not silently drop the other tenants.
if workflow.overwrite_configfiles and Path("config.yaml").exists():
    _base = [t.get("name") for t in (yaml.safe_load(Path("config.yaml").read_text(encoding="utf-8")) or {}).get("tenants") or []]
    _dropped = [n for n in _base if n not in TENANTS]
    if _dropped:
        print(f"qrewrite: note: --configfile replaced the tenant list of config.yaml; not in this run: "
              f"{', '.join(_dropped)}. To run some tenants of config.yaml, use --config only=NAME[,NAME].",
              file=sys.stderr)

# Apptainer image per environment (`--sdm apptainer`); built from containers/*.Containerfile (docs/cluster.md).
CONTAINERS = config["containers"]
# The same environments for `--sdm conda`, by container name (paths relative to rules/, as Snakemake reads them).
CONDA_ENVS = {"cpu": "../envs/data.yaml", "swift": "../envs/swift.yaml", "verl": "../envs/verl.yaml"}
# Stage env "rl" is rl.backend's. verl on several nodes: Ray must span the job's nodes, so
# slurm/ray_on_slurm.sh (on the host, outside Snakemake's container) starts Ray in the verl image on every
# node and runs `qrewrite rl` on the head.
RL_ENV = "verl" if config["rl"]["backend"] == "verl" else "swift"
VERL_MULTINODE = RL_ENV == "verl" and config["rl"]["verl"]["nnodes"] > 1
LAUNCHERS = {"ray": f"{workflow.basedir}/slurm/ray_on_slurm.sh --image {CONTAINERS['verl']} -- " if VERL_MULTINODE else ""}

# Every command reads exactly the config Snakemake resolved (config.yaml + --configfile + --config), less
# the run-time selection `only`. Written when the run starts (onstart: never on a dry run, `-n`), and only
# when its content changes; rules rerun on *params* changes, not on this file.
RESOLVED_CONFIG = "results/.config.resolved.yaml"


onstart:
    # a CPU without bf16 units runs `auto` in float32, several times slower: said before the hours start
    if (_speed := speed_note(config)):
        print(f"qrewrite: note: {_speed}", file=sys.stderr)
    # credential-shaped values masked: none in a config that passed validation (check_before_schema), so what the
    # commands read is unchanged
    _resolved = yaml.safe_dump(redact_values({k: v for k, v in config.items() if k != "only"}), allow_unicode=True,
                               sort_keys=True)
    if not Path(RESOLVED_CONFIG).exists() or Path(RESOLVED_CONFIG).read_text(encoding="utf-8") != _resolved:
        write_text_atomic(RESOLVED_CONFIG, _resolved)


wildcard_constraints:
    tenant="|".join(TENANTS),


# --- what a stage of the table (qrewrite/workflow/stages.py) becomes as a rule (rules/stages.smk) ------------

# Appended to a rule's shell command that sends its output to {log.cmd}: when the command fails, the log's
# tail (the stage's own error message and hint) is printed on the console too, under Snakemake's error.
SHOW_LOG_ON_ERROR = " || {{ rc=$?; echo '--- tail of {log.cmd}:' >&2; tail -n 40 {log.cmd} >&2; exit $rc; }}"


def where(s):
    """The log/benchmark path part of one job: per tenant, per tenant and candidate, or once."""
    return {"candidate": "{tenant}/{candidate}/", "once": "", "all_tenants": ""}.get(s.per, "{tenant}/")


def env(s):
    return RL_ENV if s.env == "rl" else s.env


def container(s):
    return None if s.launcher == "ray" and VERL_MULTINODE else CONTAINERS[env(s)]


def conda(s):
    return None if s.launcher == "ray" and VERL_MULTINODE else CONDA_ENVS[env(s)]


def inputs(s):
    """Input function: the job's inputs by name (an optional file the tenant leaves out is no input)."""
    return lambda wc: job_files(s, "in", TENANTS.get(wc.get("tenant")), config, CANDIDATES.get(wc.get("candidate")))


def outputs(s):
    """Output patterns with the {tenant} / {candidate} wildcards; folders as directory(), report files as report()."""
    out = {}
    given = {"raw_excel": demo_excel("{tenant}")}  # build_excel's output, a demo tenant's config-given Excel
    for name, path in named_files(s, "out", "{tenant}", given, config, "{candidate}").items():
        if s.key_of(name) in DIRECTORIES:
            path = directory(path)
        elif s.report:
            labels = {"file": Path(path).name} | ({"tenant": "{tenant}"} if s.per != "all_tenants" else {})
            path = report(path, category=s.report, subcategory="{tenant}" if s.per != "all_tenants" else None,
                          labels=labels)
        out[name] = path
    return out


def config_param(s, key):
    """The value of config key `key` (dotted; tenant.X / candidate: the job's) for Snakemake's params, as
    canonical JSON: Snakemake reruns a job whose params differ, and a mapping's key order is no difference."""
    head, _, rest = key.partition(".")

    def value(node, dotted, tenant=None):  # stages.param_value: `reward` without the judges not in use
        return json.dumps(param_value(node, dotted, tenant) if dotted else node, sort_keys=True, ensure_ascii=False)

    if head in ("tenant", "candidate"):
        table = TENANTS if head == "tenant" else CANDIDATES
        return lambda wc: value(table[wc.get(head)], rest)
    if key == "teacher" and s.per != "once":  # the job's tenant's teacher (tenants[].teacher over the global one)
        return lambda wc: value(config, key, TENANTS[wc.get("tenant")])
    text = value(config, key)
    # a string param is a pattern to Snakemake: braces in a value (serve.api_key_env's {TENANT}) would be read as
    # wildcards; a function's value is taken as it is
    return (lambda wc, t=text: t) if "{" in text or "}" in text else text


def params(s):
    """`cmd` (the command line) and every config value the stage reads (a change reruns the job)."""
    return {"cmd": command_param(s)} | {k.replace(".", "_"): config_param(s, k) for k in s.params}


def logs(s):
    """The job's log (and the model server's, for the deploy check), patterns with the rule's wildcards."""
    base = f"logs/{where(s)}{s.name}"
    return {"cmd": f"{base}.log"} | ({"server": f"{base}_server.log"} if s.server_log else {})


def command_param(s):
    """Params function: the job's command line, from the job's own files. All rules share one shell command
    (STAGE_SHELL) that refers to no loop variable of rules/stages.smk: Snakemake evaluates the shell command
    when a job runs, and by then the loop variable holds the last stage."""

    def cmd(wildcards, input, output, threads):
        line = command(s, input, output, lambda key: resolve(key, wildcards.tenant, {}, config),
                       config=RESOLVED_CONFIG, tenant=wildcards.get("tenant", ""),
                       candidate=wildcards.get("candidate", ""), threads=threads,
                       server_log=logs(s).get("server", "").format(**wildcards))
        return f"{LAUNCHERS.get(s.launcher, '')}{line}"

    return cmd


# Appended after a successful command: the stage's own warnings (logger "qrewrite.*", e.g. a teacher that hands
# the questions back unchanged) are printed on the console too, not only kept in its log.
SHOW_WARNINGS = " && {{ grep -h ' WARNING qrewrite' {log.cmd} >&2 || true; }}"

# Every rule's shell: its command (params.cmd), output to its log; then its warnings on the console, or on
# failure the log's tail.
STAGE_SHELL = f"{{params.cmd}} > {{log.cmd}} 2>&1{SHOW_WARNINGS}{SHOW_LOG_ON_ERROR}"


def constraints(s):
    """A demo tenant's Excel is built (any other tenant's data/raw/<name>.xlsx is the user's own input file);
    a candidate stage runs for its kind of candidates only."""
    if s.per == "demo_tenant":
        return {"tenant": "|".join(n for n, t in TENANTS.items() if t["demo_source"]) or "(?!)"}
    if s.per == "candidate":
        return {"candidate": "|".join(c["name"] for c in candidates(s, config)) or "(?!)"}
    return {}


# --- targets: every job's outputs of the selected tenants, by half (the table's `half`) ----------------------

def targets(*halves):
    out = []
    for s in STAGES.values():
        if s.half in halves:
            for tenant, candidate in jobs(s, config, SELECTED):
                out += flat(job_files(s, "out", tenant, config, candidate).values())
    return out
