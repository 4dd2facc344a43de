"""The Slurm profile (slurm/config.yaml) through real Snakemake dry runs, in a copy of the checkout.

`snakemake --profile slurm -n` must list every rule with its resources (GPU rules: GPUs, model, CPUs = threads,
memory, runtime; partition/account only from the environment), and `slurm/container_dryrun.py` must show the
exact Apptainer command of every job, with `--nv` for the GPU rules. The profile sets `--sdm apptainer`, so a
dry run needs an `apptainer` binary: the stub in tests/slurm/bin (a dry run never executes it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS
from test_slurm_cluster import copy_checkout

GPU_RULES = {"sft", "merge_sft", "rl", "release", "eval_generate", "deploy_check", "judge_data", "judge_sft", "judge_grpo",
             "judge_eval"}
ONE_GPU = GPU_RULES - {"sft", "rl"}
SITE_VARS = ("QREWRITE_SLURM_PARTITION", "QREWRITE_SLURM_GPU_PARTITION", "QREWRITE_SLURM_ACCOUNT",
             "QREWRITE_SLURM_GPU_MODEL", "QREWRITE_SLURM_GPUS", "QREWRITE_SLURM_GPU_CPUS", "QREWRITE_SLURM_RL_NODES",
             "QREWRITE_APPTAINER_BIND")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return copy_checkout(tmp_path_factory.mktemp("profile") / "clone")


def run(checkout: Path, *args: str, stub: bool = True, **site) -> str:
    bindir = Path(sys.executable).parent
    path = f"{TESTS / 'slurm' / 'bin'}:{bindir}:" if stub else f"{bindir}:"
    env = {k: v for k, v in os.environ.items() if k not in SITE_VARS}
    env.update({"PATH": path + "/usr/bin:/bin", **site})
    proc = subprocess.run([*args], cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{out[-6000:]}")
    return out


def snakemake(checkout: Path, *args: str, **site) -> str:
    """A dry run of `all`, `deploy` and `judge` (the serving check and the distilled judge, outside `all`): every
    rule of the workflow."""
    return run(checkout, str(Path(sys.executable).parent / "snakemake"), "--profile", "slurm", "-n", "all", "deploy",
               "judge", *args, **site)


def jobs(dry_run: str) -> list[dict]:
    """One dict per job of a dry run: rule, threads, resources (name → value as printed)."""
    out = []
    for block in re.split(r"\n(?=rule \w+:\n)", dry_run):
        m = re.match(r"rule (\w+):\n", block)
        if not m or m.group(1) in ("all", "deploy", "judge"):
            continue
        res = re.search(r"^\s+resources: (.*)$", block, flags=re.M)
        thr = re.search(r"^\s+threads: (\d+)$", block, flags=re.M)
        out.append({"rule": m.group(1), "threads": int(thr.group(1)) if thr else 1,
                    "resources": dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}})
    return out


def workflow_rules(checkout: Path) -> set[str]:
    """The rules that run a command: one per row of the stage table (the Snakefile adds only target rules), less the
    stages the checkout's config switches off (pref.enabled), which have no rule."""
    from qrewrite.config import load_config
    from qrewrite.workflow.stages import STAGES, switched_on

    cfg = load_config(checkout / "config.yaml")
    return {n for n, s in STAGES.items() if not s.switch or switched_on(cfg, s.switch)}


@pytest.mark.slow
def test_dry_run_lists_every_rule_with_its_resources(checkout):
    dry = snakemake(checkout)
    js = jobs(dry)
    assert {j["rule"] for j in js} == workflow_rules(checkout), "every rule of the workflow is in the dry run"
    for j in js:
        r = j["resources"]
        assert "mem_mb" in r and "runtime" in r, j
        # no site settings in the environment: partition and account are left to Slurm's defaults
        assert "slurm_partition" not in r and "slurm_account" not in r, j
        if j["rule"] in GPU_RULES:
            assert r["gpu"] == ("8" if j["rule"] in {"sft", "rl"} else "1"), j
            assert r["cpus_per_task"] == "16" and j["threads"] == 16, j
            assert int(r["mem_mb"]) >= 64000 and int(r["runtime"]) >= 120, j
            assert re.search(rf"--threads {j['threads']}\b", dry) or j["rule"] != "sft"
        else:
            assert "gpu" not in r and "gres" not in r and j["threads"] == 1, j
            assert int(r["mem_mb"]) <= 16000, j


@pytest.mark.slow
def test_site_settings_come_from_the_environment(checkout):
    site = {"QREWRITE_SLURM_PARTITION": "cpu-short", "QREWRITE_SLURM_GPU_PARTITION": "gpu-h100",
            "QREWRITE_SLURM_ACCOUNT": "proj42", "QREWRITE_SLURM_GPU_MODEL": "h100", "QREWRITE_SLURM_GPUS": "4",
            "QREWRITE_SLURM_GPU_CPUS": "12"}
    for j in jobs(snakemake(checkout, **site)):
        r = j["resources"]
        assert r["slurm_account"] == "proj42", j
        if j["rule"] in GPU_RULES:
            assert r["slurm_partition"] == "gpu-h100" and r["gpu_model"] == "h100", j
            assert r["cpus_per_task"] == "12" and j["threads"] == 12, j
            assert r["gpu"] == ("1" if j["rule"] in ONE_GPU else "4"), j
        else:
            assert r["slurm_partition"] == "cpu-short" and "gpu_model" not in r, j


@pytest.mark.slow
def test_multi_node_rl_asks_for_gpus_per_node(checkout):
    site = {"QREWRITE_SLURM_RL_NODES": "2", "QREWRITE_SLURM_GPUS": "8", "QREWRITE_SLURM_GPU_MODEL": "h100"}
    rl = [j for j in jobs(snakemake(checkout, **site)) if j["rule"] == "rl"]
    assert rl
    for j in rl:
        r = j["resources"]
        assert r["nodes"] == "2" and r["gres"] == "gpu:h100:8" and "gpu" not in r, j


@pytest.mark.slow
def test_memory_grows_per_attempt(checkout):
    """The profile's memory is `N * attempt`: attempt 2 (the first retry) asks for twice as much."""
    first = {(j["rule"], j["resources"]["mem_mb"]) for j in jobs(snakemake(checkout))}
    second = {(j["rule"], j["resources"]["mem_mb"]) for j in jobs(snakemake(checkout, "--attempt", "2"))}
    mem1, mem2 = dict(first), dict(second)
    assert mem1.keys() == mem2.keys()
    assert not [r for r in mem1 if int(mem2[r]) != 2 * int(mem1[r])], {r: (mem1[r], mem2[r]) for r in mem1 if int(mem2[r]) != 2 * int(mem1[r])}


@pytest.mark.slow
def test_container_dry_run_shows_exact_apptainer_commands(checkout):
    out = run(checkout, sys.executable, "slurm/container_dryrun.py", "--profile", "slurm", "all", "deploy", "judge",
              QREWRITE_APPTAINER_BIND="/models,/scratch")
    cmds = re.findall(r"^Container command \((\w+)\): (.*)$", out, flags=re.M)
    assert {r for r, _ in cmds} == workflow_rules(checkout), "every job runs in a container"
    images = {"cpu": "containers/cpu.sif", "swift": "containers/swift.sif", "verl": "containers/verl.sif"}
    for rule, cmd in cmds:
        m = re.match(r"\s*apptainer\s+exec --home '([^']+)' (.*?) (containers/\w+\.sif) bash -c '(.*)'$", cmd)
        assert m, cmd
        home, args, image, inner = m.groups()
        assert Path(home) == checkout and image in images.values(), cmd
        assert "--bind /models,/scratch" in args, cmd
        if rule in GPU_RULES:
            assert "--nv" in args.split(), f"GPU rule {rule} without --nv: {cmd}"
            assert image in (images["swift"], images["verl"]), cmd
        if rule in {"build_excel", "ingest", "teacher", "validate", "split", "reward_check", "summarize", "rl_data",
                    "eval_rewrites", "eval", "report"}:
            assert image == images["cpu"], cmd
        assert inner.startswith("set -euo pipefail;") and "qrewrite " in inner, cmd


@pytest.mark.slow
def test_without_apptainer_the_profile_fails_clearly(checkout):
    """`--sdm apptainer` in the profile is not silently dropped where Apptainer is missing."""
    with pytest.raises(AssertionError, match="apptainer or singularity command has to be available"):
        run(checkout, str(Path(sys.executable).parent / "snakemake"), "--profile", "slurm", "-n", stub=False)


@pytest.mark.parametrize("env,device,want", [
    ({}, "cpu", 1), ({"SLURM_GPUS_ON_NODE": "8"}, "cpu", 1),            # CPU training: one process
    ({}, "cuda", 1), ({"SLURM_GPUS_ON_NODE": "8"}, "cuda", 8),         # the profile's 8 GPUs for sft
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "cuda", 4),                  # a GPU node outside Slurm
    ({"NPROC_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "8"}, "cuda", 2)])  # set by hand: as given
def test_sft_runs_one_process_per_gpu_the_job_was_given(env, device, want):
    """SFT's torchrun processes follow the Slurm allocation (ms-swift reads NPROC_PER_NODE): the profile asks 8 GPUs
    for sft, and without NPROC_PER_NODE one process trained on one of them."""
    from qrewrite.hardware import processes_per_node

    assert processes_per_node(device, env) == want
