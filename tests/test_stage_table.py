"""The stage table (qrewrite/workflow/stages.py) is the one source of the stage graph, and one name runs through
every view of it: rule `merge_sft` runs `qrewrite merge-sft`, handled by `cmd_merge_sft` in
qrewrite/training/cli.py, and is DVC stage `merge_sft@T`. Asked of Snakemake, the parser and dvc.yaml
themselves, not of the table, so a view that drifts fails here."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, doc_section
from qrewrite.cli import build_parser
from qrewrite.config import load_config
from qrewrite.workflow.code_deps import registration_importers
from qrewrite.workflow.stages import CONFIG_FILES, STAGES, job_threads, jobs

TARGET_RULES = {"all", "data", "models", "deploy", "judge"}


def switched_on() -> set[str]:
    """The stages config.yaml runs: a stage with a `switch` (pref.enabled) the config turns off has no rule, no DVC
    stage and no command to parse (test_every_stage_has_jobs_under_the_demo_config checks it has jobs when on)."""
    cfg = load_config(REPO / "config.yaml")
    return {n for n, s in STAGES.items() if jobs(s, cfg) or not s.switch}


def snakemake(*args: str) -> str:
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """`qrewrite`'s subcommand name -> its parser, as the CLI dispatches it."""
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_snakemake_has_one_rule_per_stage_and_its_docstring_names_the_handler():
    listed = dict(re.match(r"(\w+)(?: \((.*)\))?$", line.strip()).groups()
                  for line in snakemake("--list-rules").splitlines() if line.strip())
    assert set(listed) - TARGET_RULES == switched_on(), sorted(set(listed) ^ switched_on() - TARGET_RULES)
    for name, s in STAGES.items():
        if name not in switched_on():
            continue
        assert f"qrewrite/{s.package}/cli.py cmd_{name}" in listed[name], (name, listed[name])


def test_every_stage_command_is_dispatched_to_the_handler_of_its_name_in_its_package():
    sub = subcommands()
    for name, s in STAGES.items():
        func = sub[s.command].get_default("func")
        assert (func.__module__, func.__name__) == s.handler, name
        assert s.command == name.replace("_", "-")


def test_help_lists_the_stages_in_pipeline_order_then_the_tools():
    proc = subprocess.run([sys.executable, "-m", "qrewrite", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^    ([a-z][a-z0-9-]*)", proc.stdout, flags=re.M)
    stages = [s.command for s in STAGES.values()]
    assert listed[:len(stages)] == stages, listed
    assert set(listed) == set(subcommands()), sorted(set(listed) ^ set(subcommands()))


def test_every_command_snakemake_and_dvc_run_parses():
    """A flag the table passes that the subcommand does not take fails here, not on a cluster (merge-sft got
    --threads from its rule's threads and took none)."""
    parser = build_parser()
    cmds = [line.removeprefix("Shell command: ") for line in
            snakemake("-n", "-p", "--forceall", "all", "deploy", "judge").splitlines()
            if line.startswith("Shell command: ") and line != "Shell command: None"]  # None: the target rules
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    cmds += [st.get("do", st)["cmd"] for st in stages.values()]
    seen = set()
    for cmd in cmds:
        argv = shlex.split(re.split(r" (?:2?>|\|\|) ", cmd)[0])
        argv = argv[argv.index("qrewrite") + 1:]  # after a launcher (slurm/ray_on_slurm.sh ... --)
        args = parser.parse_args(argv)  # SystemExit (a failure) on an unknown or missing flag
        seen.add(args.command)
    assert seen == {STAGES[n].command for n in switched_on()}


def test_every_dvc_stage_is_a_stage_of_the_table_under_its_name():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert set(stages) == {n for n, s in STAGES.items() if s.dvc and n in switched_on()}
    for name, stage in stages.items():
        assert stage.get("do", stage)["cmd"].split()[:2] == ["qrewrite", STAGES[name].command], name


def test_the_graph_is_closed_every_file_has_one_maker():
    """Every output key has one stage that makes it; every input is made by a stage or given by the config."""
    made: dict[str, list] = {}
    for s in STAGES.values():
        for k in s.keys("out"):
            made.setdefault(k, []).append(s)
    for k, makers in made.items():
        # one maker, or per-candidate stages over disjoint candidates (eval_generate: models, eval_rewrites: others)
        assert len(makers) == 1 or (all(m.per == "candidate" for m in makers)
                                    and len({m.candidates for m in makers}) == len(makers)), (k, makers)
    derived = {"eval_split", "all_rewrites", "rewrites", "candidate_model", "deploy_model",
               "deploy_rewrites"}
    for s in STAGES.values():
        for k in s.keys("in"):
            assert k in made or k in CONFIG_FILES or k in derived, (s.name, k)


def test_every_stage_has_jobs_under_the_demo_config():
    cfg = load_config(REPO / "config.yaml")
    assert all(jobs(s, cfg) for s in STAGES.values() if not s.switch)
    # a switched stage (pref.enabled) has jobs once its switch is on, and none while it is off
    for s in STAGES.values():
        if s.switch:
            section, key = s.switch.rsplit(".", 1)
            for on in (True, False):
                cfg[section][key] = on
                assert bool(jobs(s, cfg)) is on, (s.name, on)


def test_only_the_top_level_cli_imports_a_stage_cli_module():
    """code_deps leaves other stages' `cli` modules out of a stage's deps: that is right only while nothing but
    qrewrite/cli.py (which registers their subcommands) imports them."""
    assert registration_importers() == {}


def test_nothing_in_the_package_imports_the_top_level_cli():
    """qrewrite/cli.py is the top layer (it imports every stage package's cli to register it): a module that imports
    it back closes a circle (dvc_gen once read the handlers off its parser; the stage table has them now)."""
    pkg = Path(__file__).resolve().parents[1] / "qrewrite"
    absolute = re.compile(r"^\s*(from\s+qrewrite\.cli\s+import|import\s+qrewrite\.cli\b)", re.M)
    offenders = []
    for p in pkg.rglob("*.py"):
        # `.cli` is the top-level cli from qrewrite/*.py, `..cli` from a stage package (its own `.cli` is fine)
        relative = re.compile(r"^\s*from\s+%s\s+import" % (r"\.cli" if p.parent == pkg else r"\.\.cli"), re.M)
        text = p.read_text(encoding="utf-8")
        if p.name != "__main__.py" and (absolute.search(text) or relative.search(text)):
            offenders.append(str(p.relative_to(pkg)))
    assert offenders == []


def test_the_product_does_not_depend_on_the_labs_tools():
    """tools/ (the GPU loan's kit, tools/gpukit/) is built on qrewrite, never the other way: nothing in qrewrite/
    imports it or runs one of its modules (`python -m tools...`), so the product ships and runs without it."""
    use = re.compile(r"^\s*(from\s+tools[.\s]|import\s+tools\b)|[\"']tools\.\w", re.M)
    found = [f"{p.relative_to(REPO)}: {m.group(0).strip()}" for p in sorted((REPO / "qrewrite").rglob("*.py"))
             for m in use.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
    # and the planted uses are caught
    assert use.search("    from tools.gpukit import kit\n") and use.search('cmd = [py, "-m", "tools.gpukit.phase"]')


def test_the_reward_does_not_reach_up_into_the_judge_training_package():
    """qrewrite/judge/ trains the distilled judge on top of the reward; what that judge reads and writes lives in
    reward/judge_prompt.py, which the reward's model judge serves (it once imported judge/prompt.py)."""
    reward = Path(__file__).resolve().parents[1] / "qrewrite" / "reward"
    up = re.compile(r"^\s*(from\s+(qrewrite\.|\.\.)judge\b|import\s+qrewrite\.judge\b)", re.M)
    assert [p.name for p in reward.glob("*.py") if up.search(p.read_text(encoding="utf-8"))] == []


def test_the_runtime_stands_below_the_stages_the_eval_and_the_gateway():
    """qrewrite/runtime/ is what the release stage and the eval score and the gateway serves: it imports from the
    shared modules only, never from a stage package, the eval, the gateway or the deploy check (docs/code.md)."""
    above = ("eval", "serve", "release", "deploy", "training", "data", "teacher", "judge", "onboard", "report",
             "workflow", "cli")
    up = re.compile(r"^\s*(from\s+(qrewrite\.|\.\.)(%s)\b|import\s+qrewrite\.(%s)\b)" % ("|".join(above),
                                                                                   "|".join(above)), re.M)
    found = [f"{p.relative_to(REPO)}: {m.group(0).strip()}" for p in sorted((REPO / "qrewrite/runtime").glob("*.py"))
             for m in up.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
    # and the planted crossing is caught
    assert up.search("    from ..eval.candidates import RULE_REWRITES\n")


def test_docs_map_every_rule_to_its_handler():
    """docs/code.md "One name per stage, one hop to its code": one row per rule, naming the file that holds its
    handler."""
    section = doc_section(REPO / "docs" / "code.md", "One name per stage, one hop to its code")
    rows = re.findall(r"^\| `(\w+)` \| `qrewrite ([\w-]+)` \| `([\w/]+\.py)` `(\w+)` \|", section, flags=re.M)
    assert {r[0] for r in rows} == set(STAGES), sorted(set(STAGES) ^ {r[0] for r in rows})
    for rule, cmd, path, handler in rows:
        s = STAGES[rule]
        assert (cmd, (path.removesuffix(".py").replace("/", "."), handler)) == (s.command, s.handler), rule
        for logic in re.findall(r"`(qrewrite/[\w/]+\.py)`", section.split(f"| `{rule}` |", 1)[1].split("\n", 1)[0]):
            assert (REPO / logic).is_file(), (rule, logic)


@pytest.mark.slow
def test_a_split_threshold_reruns_the_split_and_downstream_only(project):
    """Each rule's params are the config keys its stage reads: after a finished data half, a new
    tenants[].thresholds.top1 reruns that tenant's split and what uses the split, not ingest, teacher or
    validate (ingest used to track the whole tenant entry, so any tenant setting reran the data half)."""
    for tenant in ("fivedoctors", "chengla"):
        project.keep_queries(tenant, 30)
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def snake(*args: str) -> str:
        proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--cores", "2",
                               *args], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return proc.stdout + proc.stderr

    snake("data")
    assert "Nothing to be done" in snake("-n", "data")
    # the settings of judges reward.judge.provider does not name (rule here) change nothing the reward check makes,
    # which gates the student's training: no rerun (stages.param_value)
    project.update(reward={"judge": {"model": {"rule_weight": 0.5, "batch_size": 2}, "openai": {"model": "gpt-5-mini"}}})
    assert "Nothing to be done" in snake("-n", "data")
    project.update_tenant("fivedoctors", thresholds={"top1": 0.2})
    planned = set(re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: tenant=(\w+)", snake("-n", "data"), flags=re.M))
    assert planned == {("split", "fivedoctors"), ("summarize", "fivedoctors"), ("data_card", "fivedoctors")}, planned


def test_reward_params_leave_out_the_judges_not_in_use():
    from qrewrite.workflow.stages import STAGES, param_value

    judge = {"provider": "rule", "sample_share": 0.3, "model": {"rule_weight": 0.5}, "openai": {"model": "gpt-5"}}
    cfg = {"reward": {"weights": {"judge": 1.0}, "judge": judge}}
    assert param_value(cfg, "reward") == {"weights": {"judge": 1.0}, "judge": {"provider": "rule", "sample_share": 0.3}}
    judge["provider"] = "model"
    assert param_value(cfg, "reward")["judge"] == {"provider": "model", "sample_share": 0.3,
                                                   "model": {"rule_weight": 0.5}}
    assert param_value(cfg, "reward.judge.openai") == {"model": "gpt-5"} and param_value(cfg, "eval.x") is None
    assert cfg["reward"]["judge"]["openai"] == {"model": "gpt-5"}  # the config itself is left as it was
    # judge-eval reads the distilled judge's settings and the API judge's price whatever the provider
    assert {"reward.judge.model", "reward.judge.openai"} <= set(STAGES["judge_eval"].params)


def test_a_demo_tenant_whose_excel_is_elsewhere_is_a_clear_error(project):
    """Rule build_excel writes a demo tenant's Excel at data/raw/<name>.xlsx: another raw_excel for a tenant
    with a demo_source would leave ingest without a maker, so Snakemake says what to change."""
    project.update_tenant("fivedoctors", raw_excel="data/raw/other.xlsx")
    exe = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "-n"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "data/raw/fivedoctors.xlsx, not data/raw/other.xlsx" in out, out[-2000:]
    assert "demo_source: null" in out


@pytest.mark.slow
def test_auto_threads_share_the_cores_among_the_tenants_and_snakemake_passes_them():
    assert job_threads(6, 2, 2) == 6  # an integer is taken as given (Snakemake caps it at --cores)
    assert [job_threads("auto", 2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert job_threads("auto", 16, 3) == 5 and job_threads("auto", None, 2) == 1
    exe = Path(sys.executable).parent / "snakemake"

    def threads(*extra: str) -> set[str]:
        out = subprocess.run([str(exe), "-n", "-p", "--forceall", "--cores", "2", *extra], cwd=REPO, text=True,
                             capture_output=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return set(re.findall(r"qrewrite sft .*?--threads (\d+)", out.stdout + out.stderr))

    names = [t["name"] for t in load_config(REPO / "config.yaml")["tenants"]][:2]
    assert len(names) == 2, names
    assert threads("--config", f"only={','.join(names)}", "train={threads: auto}") == {"1"}  # side by side
    assert threads("--config", f"only={names[0]}", "train={threads: auto}") == {"2"}  # one tenant: both cores


@pytest.mark.slow
def test_rl_runs_ahead_of_the_eval_generation_that_can_wait():
    """The stage table's priority reaches Snakemake: its dry run prints each job's priority when it is not 0."""
    assert STAGES["rl"].priority > STAGES["eval_generate"].priority
    out = snakemake("-n", "--forceall", "--cores", "2")
    blocks = re.split(r"\n(?=(?:local)?rule \w+:)", out)
    prio = {}
    for b in blocks:
        m = re.match(r"(?:local)?rule (\w+):", b)
        if m:
            p = re.search(r"^\s+priority: (\d+)$", b, re.M)
            prio.setdefault(m.group(1), set()).add(int(p.group(1)) if p else 0)
    assert prio["rl"] == {STAGES["rl"].priority}, prio
    assert prio["eval_generate"] == {0} and prio["sft"] == {0}, prio


def test_the_training_gate_waits_for_the_data_card_its_stop_names():
    # the gate's stop message sends the user to data_card.md; without this edge a gate that stops in seconds could
    # end the run before Snakemake started the card
    assert "data_card" in STAGES["training_gate"].keys("in")
