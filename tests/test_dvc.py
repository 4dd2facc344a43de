"""dvc.yaml: generated from paths.py + config.yaml, and equivalent to the Snakemake rules in rules/*.smk; the local
remote and DVC-tracked raw Excel files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from qrewrite.workflow.stages import STAGES

STAGE_RULES = ("build_excel", "ingest", "teacher", "validate", "split", "reward_check", "summarize", "data_card",
               "base_model", "training_gate", "sft_targets", "sft",
               "merge_sft", "rl_data", "rl", "release", "eval_generate", "eval_rewrites", "eval", "report")
SNAKEMAKE_CONFIG = "--config results/.config.resolved.yaml"
_CONFIG = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
TRAIN_THREADS = _CONFIG.get("train", {}).get("threads", 1)
TENANT_NAMES = [t["name"] for t in _CONFIG["tenants"]]
DATA_STAGES = ("build_excel", "ingest", "teacher", "validate", "split", "reward_check", "summarize")


def qrewrite(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qrewrite", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_committed_dvc_yaml_is_up_to_date():
    proc = qrewrite("dvc-yaml", "--check")
    assert proc.returncode == 0, f"dvc.yaml is stale; run `qrewrite dvc-yaml`:\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_check_fails_on_a_stale_dvc_yaml(tmp_path):
    stale = tmp_path / "dvc.yaml"
    stale.write_text((REPO / "dvc.yaml").read_text(encoding="utf-8").replace("--out-dir", "--outdir"),
                     encoding="utf-8")
    proc = qrewrite("dvc-yaml", "--check", "--out", str(stale))
    assert proc.returncode != 0 and "stale" in proc.stderr and "--outdir" in proc.stderr
    assert qrewrite("dvc-yaml", "--out", str(stale)).returncode == 0
    # regenerated: the repo's stages, with the code deps and the schema (a params file) relative to this
    # dvc.yaml's folder
    rebased = os.path.relpath(REPO / "qrewrite", tmp_path)
    assert stale.read_text(encoding="utf-8") == \
        re.sub(r"^(\s*- )qrewrite/(\S+\.py|schemas/\S+\.yaml:)$", rf"\1{rebased}/\2",
               (REPO / "dvc.yaml").read_text(encoding="utf-8"), flags=re.M)
    assert qrewrite("dvc-yaml", "--check", "--out", str(stale)).returncode == 0


# --- DVC's view: dvc.yaml with every `foreach` expanded (DVC's own templating rules, no dvc import) ----------

def _interpolate(value, key: str, item: dict | None):
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
    """{(stage, key): {cmd, deps, outs, params}} from the committed dvc.yaml; key is the foreach key (tenant,
    or tenant-candidate for eval candidates), "" for a stage that runs once (base_model, report)."""
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    out = {}
    for name, stage in doc["stages"].items():
        if "foreach" in stage:
            assert isinstance(stage["foreach"], dict), f"{name}: expected a foreach keyed by tenant (or tenant-candidate)"
            expanded = [(k, _interpolate(stage["do"], k, item)) for k, item in stage["foreach"].items()]
        else:
            expanded = [("", stage)]
        for key, do in expanded:
            out[(name, key)] = {
                "cmd": do["cmd"],
                "deps": _paths(do.get("deps")),
                "outs": _paths(do.get("outs")) | _paths(do.get("metrics")) | _paths(do.get("plots")),
                "params": do.get("params", []),
            }
    return out


# --- Snakemake's view: `snakemake -n -p --forceall` in a scratch dir ---------------------------------------

def snakemake_jobs(root: Path) -> dict[tuple[str, str], dict]:
    """{(rule, key): {cmd, deps, outs}} from a dry run that plans every job from scratch; key as in dvc_stages."""
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # as many cores as the training rules' threads, so `--threads {threads}` is not capped below config
    # (`auto`: two cores per tenant, as_dvc_cmd checks the share and drops it: dvc repro leaves it to the command)
    cores = TRAIN_THREADS if TRAIN_THREADS != "auto" else 2 * len(TENANT_NAMES)
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(root), "-n", "-p", "--forceall",
                           "--cores", str(cores)], capture_output=True, text=True, env=env, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    jobs = {}
    for block in re.split(r"^(?:local)?rule ", text, flags=re.M)[1:]:
        rule = block.split(":", 1)[0].strip()
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        cmd = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        wildcards = dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ") if "=" in kv)
        if rule in ("all", "data", "models"):
            continue  # target rules, no command
        assert cmd, f"no shell command printed for {rule}:\n{block}"
        key = "-".join(wildcards[w] for w in ("tenant", "candidate") if w in wildcards)
        split = lambda s: {p for p in s.split(", ") if p}  # noqa: E731
        jobs[(rule, key)] = {"cmd": cmd.group(1).strip(), "deps": split(fields.get("input", "")),
                             "outs": split(fields.get("output", ""))}
    assert jobs, f"could not parse any job from the snakemake dry run:\n{text[-3000:]}"
    return jobs


def as_dvc_cmd(snakemake_cmd: str) -> str:
    """The Snakemake shell command as the DVC stage runs it: the source config, no redirect to logs/."""
    assert SNAKEMAKE_CONFIG in snakemake_cmd or snakemake_cmd.startswith("qrewrite summarize"), snakemake_cmd
    cmd = snakemake_cmd.replace(SNAKEMAKE_CONFIG, "--config config.yaml")
    if TRAIN_THREADS == "auto":  # Snakemake's share of --cores (2 per tenant); dvc.yaml leaves threads out
        assert " --threads " not in cmd or " --threads 2" in cmd, cmd
        cmd = cmd.replace(" --threads 2", "")
    cmd = re.sub(r" \|\| \{ rc=\$\?;.*\}$", "", cmd)  # common.smk SHOW_LOG_ON_ERROR
    cmd = re.sub(r" && \{ grep -h ' WARNING qrewrite' .*\}$", "", cmd)  # common.smk SHOW_WARNINGS
    return re.sub(r"\s+(2>\s*logs/\S+|>\s*logs/\S+\s+2>&1)$", "", cmd).strip()


@pytest.mark.slow
def test_dvc_stages_match_snakemake_rules(project):
    jobs = snakemake_jobs(project.root)
    stages = dvc_stages()
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    tenants = [t["name"] for t in cfg["tenants"]]
    assert {k.split("-")[0] for _, k in jobs if k} == set(tenants)
    assert set(stages) == set(jobs), f"only in dvc.yaml: {set(stages) - set(jobs)}; " \
                                     f"only in Snakemake: {set(jobs) - set(stages)}"
    for (rule, tenant), job in sorted(jobs.items()):
        assert rule in STAGE_RULES
        stage = stages[(rule, tenant)]
        assert stage["cmd"] == as_dvc_cmd(job["cmd"]), (rule, tenant)
        assert stage["outs"] == job["outs"], (rule, tenant)
        # the data deps as in the rule; DVC adds the stage's code (test_dvc_stage_code_deps)
        assert {d for d in stage["deps"] if not d.startswith("qrewrite/")} == job["deps"], (rule, tenant)


def test_dvc_stage_code_deps():
    """Each stage depends on the files its command runs (shared modules included), and not on another stage's
    handler: split's code is no dep of the stages upstream of it. The reward plugins `qrewrite rl` hands to
    ms-swift / verl by path count for rl."""
    from qrewrite.training.rl.swift_grpo import PLUGIN
    from qrewrite.training.rl.verl.train import REWARD_FILE

    code = {}
    for (stage, _), spec in dvc_stages().items():
        files = {d for d in spec["deps"] if d.startswith("qrewrite/")}
        assert files and all((REPO / f).is_file() for f in files), stage
        assert code.setdefault(stage, files) == files, f"{stage}: tenants differ in code deps"
    assert {"qrewrite/data/split.py", "qrewrite/io_utils.py", "qrewrite/config.py", "qrewrite/cli.py"} <= code["split"]
    for upstream in ("build_excel", "ingest", "teacher", "validate"):
        assert "qrewrite/data/split.py" not in code[upstream], upstream
    assert "qrewrite/rag/validate.py" in code["validate"] and "qrewrite/teacher/stage.py" in code["teacher"]
    assert {p.relative_to(REPO).as_posix() for p in (PLUGIN, REWARD_FILE)} <= code["rl"]
    assert "qrewrite/training/rl/data.py" in code["rl_data"] and "qrewrite/reward/ground_truth.py" in code["rl_data"]


def copy_code(root: Path) -> None:
    """The qrewrite package into a scratch project, where dvc.yaml's code deps (qrewrite/...) point."""
    shutil.copytree(REPO / "qrewrite", root / "qrewrite", ignore=shutil.ignore_patterns("__pycache__"))


def run_in(root: Path, *cmd: str) -> str:
    """Run `cmd` in scratch project `root` with this venv's tools; its output, or a failure showing it."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(list(cmd), cwd=root, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def dvc_in(root: Path, *args: str) -> str:
    return run_in(root, sys.executable, "-m", "dvc", *args)


def test_dvc_params_name_existing_keys_of_the_right_tenant():
    """Every param key resolves in its file (DVC fails on a missing one); tenant keys point at the stage's own
    tenant and candidate keys at the stage's own eval candidate (a stale list index would silently track
    another one)."""
    files = {"config.yaml": yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8")),
             "qrewrite/schemas/config.schema.yaml":
                 yaml.safe_load((REPO / "qrewrite/schemas/config.schema.yaml").read_text(encoding="utf-8"))}
    cfg = files["config.yaml"]
    seen = set()
    for (stage, key), spec in dvc_stages().items():
        tenant = key.split("-")[0]
        for entry in spec["params"]:
            (fname, keys), = entry.items()
            assert fname in files, entry
            for k in keys:
                node = files[fname]
                for part in k.split("."):
                    node = node[int(part)] if isinstance(node, list) else node[part]
                parts = k.split(".")
                if parts[0] == "tenants":
                    assert cfg["tenants"][int(parts[1])]["name"] == tenant, (stage, key, k)
                if parts[:2] == ["eval", "candidates"] and len(parts) > 2:
                    assert f"{tenant}-{cfg['eval']['candidates'][int(parts[2])]['name']}" == key, (stage, key, k)
                    parts = parts[:2]
                if fname != "config.yaml":
                    label = "schema"
                elif parts[0] == "tenants":
                    label = ".".join(["tenants", *parts[2:]])
                else:
                    label = ".".join(parts) if parts[0] == "eval" else parts[0]
                seen.add((stage, label))
    # Each stage tracks the config its row of the stage table names: a key config.yaml has as that key (a
    # tenant's under its own index), a key it leaves out as its schema default, a candidate as its entry.
    from qrewrite.workflow.stages import STAGES, jobs

    def label(k: str) -> str:
        head, _, rest = k.partition(".")
        if head == "tenant":
            node = cfg["tenants"][0]
            for part in rest.split(".") if rest else []:
                if not isinstance(node, dict) or part not in node:
                    return "schema"
                node = node[part]
            return ".".join(["tenants", *([rest] if rest else [])])
        if head == "candidate":
            return "eval.candidates"
        node = cfg
        for part in k.split("."):  # a key config.yaml leaves out (rag.local beside a written rag:): the default's
            if not isinstance(node, dict) or part not in node:
                return "schema"
            node = node[part]
        return k if head == "eval" else head

    # a stage the config switches off (pref.enabled: false) has no DVC stage, so no params
    want = {(s.name, label(k)) for s in STAGES.values() if s.dvc and jobs(s, cfg) for k in s.params}
    assert seen == want, (sorted(seen - want), sorted(want - seen))
    # the precise keys: a threshold of the split does not rerun ingest (it used to track the whole tenant)
    assert ("ingest", "tenants") not in seen and ("ingest", "tenants.columns") in seen
    assert ("split", "tenants.thresholds") in seen


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_and_reruns_only_what_changed(project):
    """The real thing: `dvc repro` from scratch (one data half, shared by the three checks to keep its time down),
    up to date after; then
    - an edit to the split stage's code (qrewrite/data/split.py) makes `dvc status` report split (its code dep
      changed) and nothing upstream, and `dvc repro` plan split and what is downstream of it (summarize), every
      tenant, nothing upstream; with the edit undone, everything is up to date again;
    - a change to one tenant's demo source plans, and reruns, only that tenant's stages.
    (`dvc repro --dry` alone cannot plan from scratch: it fails on the not-yet-built outputs of upstream stages,
    treeverse/dvc#9021.)"""
    root = project.root
    tenants = ("fivedoctors", "chengla")
    for tenant in tenants:
        project.keep_queries(tenant, 30)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    copy_code(root)

    def dvc(*args: str) -> str:
        return dvc_in(root, *args)

    def ran(out: str) -> set[str]:
        return set(re.findall(r"Running stage '([\w@-]+)'", out))

    def planned(*args: str) -> set[str]:
        return ran(dvc("repro", "--dry", *args, "summarize"))

    # The data half (`dvc repro summarize`: every stage upstream of summary.json). Training, eval and report
    # through DVC: tests/test_pipeline_e2e.py::test_dvc_adopts_the_run_and_reruns_only_the_changed_tenant.
    every = {f"{s}@{t}" for s, t in dvc_stages() if s in DATA_STAGES}
    run_in(root, "git", "init", "-q")
    dvc("init", "-q")
    assert ran(dvc("repro", "summarize")) == every
    assert (root / "results/chengla/summary.json").exists() and (root / "results/fivedoctors/sft/train.jsonl").exists()
    assert "up to date" in dvc("status", "summarize")
    assert json.loads(dvc("status", "--json", "--with-deps", "summarize")) == {}
    assert not planned()

    split = root / "qrewrite/data/split.py"
    code = split.read_text(encoding="utf-8")
    split.write_text(code + "\n# a code change\n", encoding="utf-8")
    status = json.loads(dvc("status", "--json", "--with-deps", "summarize"))  # summarize and all upstream of it
    print("dvc status after editing qrewrite/data/split.py:", json.dumps(status, indent=1))
    assert set(status) == {f"split@{t}" for t in tenants}, status
    for t in tenants:
        assert {"changed deps": {"qrewrite/data/split.py": "modified"}} in status[f"split@{t}"]
    # --dry lists the stages whose deps changed now; --force-downstream adds what a rerun would feed
    assert planned() == {f"split@{t}" for t in tenants}
    assert planned("--force-downstream") == {f"{s}@{t}" for s in ("split", "summarize") for t in tenants}
    split.write_text(code, encoding="utf-8")
    assert json.loads(dvc("status", "--json", "--with-deps", "summarize")) == {}

    src = root / "data/demo/chengla.queries.jsonl"
    src.write_text(src.read_text(encoding="utf-8") + '{"query": "雅思课程可以退费吗", "profile": "", "history": "", '
                   '"gold_doc_ids": []}\n', encoding="utf-8")
    plan = planned()
    assert plan and all(s.endswith("@chengla") for s in plan), plan
    assert ran(dvc("repro", "summarize")) == {s for s in every if s.endswith("@chengla")}


def test_dvc_is_pinned_once_in_the_env_make_run_installs():
    """`make run` installs envs/data.txt (.venv/.data-env), so dvc is pinned there, once in envs/, and it is the
    dvc next to this Python (the docs' `.venv/bin/dvc`; the e2e test runs docs/eval-lineage.md's commands with it)."""
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    run_deps = re.search(r"^run:(.*)$", make, flags=re.M).group(1).split()
    assert "$(VENV)/.data-env" in run_deps, run_deps
    data_env = re.search(r"^\$\(VENV\)/\.data-env:.*\n((?:\t.*\n)+)", make, flags=re.M).group(1)
    assert "-r envs/data.txt" in data_env, data_env
    pins = {f.name: re.findall(r"^dvc==(\S+)$", f.read_text(encoding="utf-8"), flags=re.M)
            for f in sorted((REPO / "envs").glob("*.txt"))}
    assert {k: v for k, v in pins.items() if v} == {"data.txt": [pins["data.txt"][0]]}, pins
    proc = subprocess.run([str(Path(sys.executable).parent / "dvc"), "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == pins["data.txt"][0], proc.stdout + proc.stderr


def test_repo_declares_a_default_local_remote():
    import configparser

    cp = configparser.ConfigParser()
    cp.read(REPO / ".dvc/config")
    assert cp["core"]["remote"] == "local"
    assert cp['\'remote "local"\'']["url"] == "../../qrewrite-dvc-remote"  # relative to .dvc/: next to the checkout


@pytest.mark.slow
def test_real_tenant_raw_excel_is_dvc_tracked_and_round_trips_through_a_local_remote(project, tmp_path):
    """A tenant without demo_source: its raw Excel is `dvc add`ed (data/raw/acme.xlsx.dvc), ingest depends on
    it, and `dvc push` / `dvc pull` through a local remote restore the exact bytes after the file is lost."""
    root = project.root
    project.keep_queries("fivedoctors", 20)
    project.stage("build-excel")  # a real workbook to play the tenant's supplied file
    shutil.move(root / "data/raw/fivedoctors.xlsx", root / "data/raw/acme.xlsx")
    cfg = project.config
    acme = dict(cfg["tenants"][0], name="acme", raw_excel="data/raw/acme.xlsx")
    acme.pop("demo_source")
    cfg["tenants"] = [acme]
    project.set_config(cfg)

    def dvc(*args: str) -> str:
        return dvc_in(root, *args)

    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvc("init", "-q")
    dvc("remote", "add", "-d", "local", str(tmp_path / "remote"))
    assert qrewrite("dvc-yaml", cwd=root).returncode == 0
    stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert "build_excel" not in stages and stages["ingest"]["foreach"]["acme"]["raw_excel"] == "data/raw/acme.xlsx"
    dvc("add", "data/raw/acme.xlsx")
    assert (root / "data/raw/acme.xlsx.dvc").is_file()
    assert re.findall(r"Running stage '([\w@-]+)'", dvc("repro", "ingest@acme")) == ["ingest@acme"]
    digest = hashlib.md5((root / "data/raw/acme.xlsx").read_bytes()).hexdigest()
    assert digest in (root / "data/raw/acme.xlsx.dvc").read_text()
    dvc("push")
    (root / "data/raw/acme.xlsx").unlink()
    shutil.rmtree(root / ".dvc/cache")
    dvc("pull", "data/raw/acme.xlsx.dvc", "ingest@acme")  # the raw Excel and the stage's outputs (dvc.lock)
    assert hashlib.md5((root / "data/raw/acme.xlsx").read_bytes()).hexdigest() == digest
    assert "up to date" in dvc("status", "ingest@acme")
