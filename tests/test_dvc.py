"""dvc.yaml: generated from paths.py + config.yaml, and equivalent to the Snakemake rules in rules/data.smk."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

STAGE_RULES = ("build_excel", "ingest", "teacher", "validate", "split", "summarize")
SNAKEMAKE_CONFIG = "--config results/.config.resolved.yaml"


def qrewrite(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qrewrite", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_committed_dvc_yaml_is_up_to_date():
    proc = qrewrite("dvc-yaml", "--check")
    assert proc.returncode == 0, f"dvc.yaml is stale; run `qrewrite dvc-yaml`:\n{proc.stderr[-3000:]}"


def test_check_fails_on_a_stale_dvc_yaml(tmp_path):
    stale = tmp_path / "dvc.yaml"
    stale.write_text((REPO / "dvc.yaml").read_text(encoding="utf-8").replace("--out-dir", "--outdir"),
                     encoding="utf-8")
    proc = qrewrite("dvc-yaml", "--check", "--out", str(stale))
    assert proc.returncode != 0 and "stale" in proc.stderr and "--outdir" in proc.stderr
    assert qrewrite("dvc-yaml", "--out", str(stale)).returncode == 0
    assert stale.read_text(encoding="utf-8") == (REPO / "dvc.yaml").read_text(encoding="utf-8")


# --- DVC's view: dvc.yaml with every `foreach` expanded (DVC's own templating rules, no dvc import) ----------

def _interpolate(value, key: str, item: dict):
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            ref = m.group(1)
            if ref == "key":
                return key
            assert ref.startswith("item."), ref
            out = item
            for part in ref.split(".")[1:]:
                out = out[part]
            return str(out)
        return re.sub(r"\$\{\s*([\w.]+)\s*\}", sub, value)
    if isinstance(value, list):
        return [_interpolate(v, key, item) for v in value]
    if isinstance(value, dict):
        return {_interpolate(k, key, item): _interpolate(v, key, item) for k, v in value.items()}
    return value


def _paths(entries: list) -> set[str]:
    return {next(iter(e)) if isinstance(e, dict) else e for e in entries or []}


def dvc_stages() -> dict[tuple[str, str], dict]:
    """{(stage, tenant): {cmd, deps, outs, params}} from the committed dvc.yaml."""
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    out = {}
    for name, stage in doc["stages"].items():
        assert isinstance(stage.get("foreach"), dict), f"{name}: expected a foreach keyed by tenant"
        for tenant, item in stage["foreach"].items():
            do = _interpolate(stage["do"], tenant, item)
            out[(name, tenant)] = {
                "cmd": do["cmd"],
                "deps": _paths(do.get("deps")),
                "outs": _paths(do.get("outs")) | _paths(do.get("metrics")),
                "params": do.get("params", []),
            }
    return out


# --- Snakemake's view: `snakemake -n -p --forceall` in a scratch dir ---------------------------------------

def snakemake_jobs(root: Path) -> dict[tuple[str, str], dict]:
    """{(rule, tenant): {cmd, deps, outs}} from a dry run that plans every job from scratch."""
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(root), "-n", "-p", "--forceall",
                           "--cores", "1"], capture_output=True, text=True, env=env, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    jobs = {}
    for block in re.split(r"^(?:local)?rule ", text, flags=re.M)[1:]:
        rule = block.split(":", 1)[0].strip()
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        cmd = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        wildcards = dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ") if "=" in kv)
        if "tenant" not in wildcards:
            continue  # rule all
        assert cmd, f"no shell command printed for {rule}:\n{block}"
        split = lambda s: {p for p in s.split(", ") if p}  # noqa: E731
        jobs[(rule, wildcards["tenant"])] = {"cmd": cmd.group(1).strip(), "deps": split(fields.get("input", "")),
                                             "outs": split(fields.get("output", ""))}
    assert jobs, f"could not parse any job from the snakemake dry run:\n{text[-3000:]}"
    return jobs


def as_dvc_cmd(snakemake_cmd: str) -> str:
    """The Snakemake shell command as the DVC stage runs it: the source config, no stderr redirect to logs/."""
    assert SNAKEMAKE_CONFIG in snakemake_cmd or snakemake_cmd.startswith("qrewrite summarize"), snakemake_cmd
    cmd = snakemake_cmd.replace(SNAKEMAKE_CONFIG, "--config config.yaml")
    return re.sub(r"\s+2>\s*logs/\S+$", "", cmd).strip()


def test_dvc_stages_match_snakemake_rules(project):
    jobs = snakemake_jobs(project.root)
    stages = dvc_stages()
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    tenants = [t["name"] for t in cfg["tenants"]]
    assert {t for _, t in jobs} == set(tenants)
    assert set(stages) == set(jobs), f"only in dvc.yaml: {set(stages) - set(jobs)}; " \
                                     f"only in Snakemake: {set(jobs) - set(stages)}"
    for (rule, tenant), job in sorted(jobs.items()):
        assert rule in STAGE_RULES
        stage = stages[(rule, tenant)]
        assert stage["cmd"] == as_dvc_cmd(job["cmd"]), (rule, tenant)
        assert stage["outs"] == job["outs"], (rule, tenant)
        assert stage["deps"] == job["deps"], (rule, tenant)


def test_dvc_params_name_existing_keys_of_the_right_tenant():
    """Every param key resolves in config.yaml (DVC fails on a missing one) and tenant keys point at the
    stage's own tenant (a stale list index would silently track another tenant)."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    seen = set()
    for (stage, tenant), spec in dvc_stages().items():
        for entry in spec["params"]:
            assert list(entry) == ["config.yaml"], entry
            for key in entry["config.yaml"]:
                node = cfg
                for part in key.split("."):
                    node = node[int(part)] if isinstance(node, list) else node[part]
                parts = key.split(".")
                if parts[0] == "tenants":
                    assert cfg["tenants"][int(parts[1])]["name"] == tenant, (stage, tenant, key)
                seen.add((stage, parts[0] if parts[0] != "tenants" else ".".join(["tenants", *parts[2:]])))
    # Mirrors the rules' `params:` in rules/data.smk.
    assert seen == {("build_excel", "tenants.columns"), ("ingest", "tenants"), ("teacher", "teacher"),
                    ("teacher", "tenants.system_prompt"), ("validate", "rag"), ("split", "split"),
                    ("split", "tenants.thresholds")}


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_and_reruns_only_the_changed_tenant(project):
    """The real thing: `dvc repro` from scratch, up to date after, and a change to one tenant's demo source
    plans only that tenant's stages. (`dvc repro --dry` alone cannot plan from scratch: it fails on the
    not-yet-built outputs of upstream stages, treeverse/dvc#9021.)"""
    if importlib.util.find_spec("dvc") is None:
        pytest.skip("DVC IS NOT INSTALLED in this env, so dvc.yaml was NOT run through DVC. "
                    "`pip install dvc==3.67.1` to run this test.")
    root = project.root
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run(*cmd: str) -> str:
        proc = subprocess.run(list(cmd), cwd=root, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    def dvc(*args: str) -> str:
        return run(sys.executable, "-m", "dvc", *args)

    def ran(out: str) -> set[str]:
        return set(re.findall(r"Running stage '([\w@-]+)'", out))

    every = {f"{s}@{t}" for s, t in dvc_stages()}
    run("git", "init", "-q")
    dvc("init", "-q")
    assert ran(dvc("repro")) == every
    assert (root / "results/chengla/summary.json").exists() and (root / "results/fivedoctors/sft/train.jsonl").exists()
    assert "up to date" in dvc("status")
    assert not ran(dvc("repro", "--dry"))

    src = root / "data/demo/chengla.queries.jsonl"
    src.write_text(src.read_text(encoding="utf-8") + '{"query": "雅思课程可以退费吗", "profile": "", "history": "", '
                   '"gold_doc_ids": []}\n', encoding="utf-8")
    planned = ran(dvc("repro", "--dry"))
    assert planned and all(s.endswith("@chengla") for s in planned), planned
    assert ran(dvc("repro")) == {s for s in every if s.endswith("@chengla")}
