"""`snakemake --profile slurm` against a real Slurm: a single-node cluster on loopback (tests/slurm/cluster.py:
slurm-wlm, munge, slurmdbd + MariaDB from apt, installed here when missing), in a copy of the repo.

It runs one tenant's data half, the base model and one LoRA SFT job (the SFT rule takes the profile's GPU path:
GPU partition, `--gpus=h100:1` on the node's fake GPU, cpus_per_task, set-threads), then checks outputs, the
Slurm accounting of every job, and what each job saw. The teacher talks to the scripted OpenAI test server,
which fails each prompt's first call: attempt 1 of the teacher job fails, Snakemake resubmits it with twice the
memory, attempt 2 succeeds. Containers: images cannot be built here (no registry), so `apptainer` is the
passthrough fake tests/slurm/bin/apptainer; the command lines it receives are the real ones.

Skipped only when Slurm is not installed and apt cannot reach its servers (said loudly).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest

from conftest import REPO, TESTS, TINY_BASE, free_port
from qrewrite.paths import BASE_MODEL, tenant_paths

sys.path.insert(0, str(TESTS / "slurm"))
import cluster  # noqa: E402

TENANT = "fivedoctors"
N_QUERIES = 20  # = the teacher's circuit breaker: attempt 1 fails all 20 first calls, attempt 2 gets all 20
TINY_SFT = {"device": "cpu", "threads": 1,  # one optimizer step: the point is the Slurm GPU path, not training
            "sft": {"max_steps": 1, "per_device_train_batch_size": 1, "per_device_eval_batch_size": 2,
                    "gradient_accumulation_steps": 1, "max_length": 512, "evals_per_epoch": 100,
                    "logging_steps": 1, "learning_rate": 2.0e-4}}
# the rules that run in the cpu image (sft_targets: the SFT targets, from the split, before sft)
DATA_RULES = ("build_excel", "ingest", "teacher", "validate", "split", "reward_check", "summarize", "data_card",
              "training_gate", "sft_targets")
SWIFT_RULES = ("base_model", "sft")


def _skip_loudly(msg: str) -> None:
    msg = f"SKIPPED (loudly): {msg}. The Slurm integration test did NOT run."
    print("\n" + "!" * 100 + f"\n{msg}\n" + "!" * 100, file=sys.stderr)
    warnings.warn(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    log = tmp_path_factory.mktemp("apt") / "apt.log"
    if cluster.missing_binaries():
        try:
            took = cluster.apt_install(log)
        except cluster.AptUnreachable as exc:
            _skip_loudly(str(exc))
        print(f"installed {cluster.APT_PACKAGES} with apt in {took:.0f}s")
        assert not cluster.missing_binaries(), f"still missing after apt: {cluster.missing_binaries()}"
    state = Path(f"/tmp/qrewrite-slurm-{uuid.uuid4().hex[:8]}")  # not under pytest's 0700 tmp: daemons write here
    state.mkdir(mode=0o755)
    c = cluster.LocalSlurm(state)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def copy_checkout(dest: Path) -> Path:
    """The repo's files as a fresh clone has them (tracked + not ignored), without .venv/.snakemake/results."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def configure(root: Path, fake_url: str) -> None:
    import yaml

    cfg = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == TENANT]
    # keep every rewrite of the stand-in teacher: 20 rows → 16/2/2 SFT samples (all fit max_length 512)
    cfg["tenants"][0]["thresholds"] = {**cfg["tenants"][0].get("thresholds", {}), "top1": 0.0}
    cfg["tenants"][0]["student"] = "always"  # 16 training rows are under the gate's floor: the gate warns, SFT runs
    cfg["teacher"] = {**cfg["teacher"], "provider": "openai", "concurrency": 4,
                      "openai": {"base_url": fake_url, "model": "fake-teacher", "api_key_env": "OPENAI_API_KEY",
                                 "max_retries": 0, "timeout_s": 20}}
    cfg["train"] = TINY_SFT
    cfg["base_model"] = dict(TINY_BASE)  # the tests' tiny model, not the embedded Qwen default
    (root / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    src = root / "data" / "demo" / f"{TENANT}.queries.jsonl"
    src.write_text("\n".join(src.read_text(encoding="utf-8").splitlines()[:N_QUERIES]) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_pipeline_runs_on_slurm_with_profile(slurm, fake_openai, tmp_path):
    from test_reward_frameworks import train_python

    train_python("swift")  # base_model and sft re-exec into .venvs/swift (fails, not skips, in CI)
    root = copy_checkout(tmp_path / "clone")
    configure(root, fake_openai.url)
    fake_openai.script(fail_first={"status": 503, "n": 1})  # every prompt: first call 503, then fine

    p = tenant_paths(TENANT)
    targets = [p["summary"], p["train"], p["val"], p["test"], BASE_MODEL, p["sft_model"]]
    apptainer_log = tmp_path / "apptainer.jsonl"
    gpu_cpus = min(2, slurm.cpus)
    env = {**os.environ,
           "PATH": f"{TESTS / 'slurm' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "OPENAI_API_KEY": "test-key-not-secret",
           # the test override: this cluster's partitions, account, GPU type and size
           "QREWRITE_SLURM_PARTITION": cluster.CPU_PARTITION, "QREWRITE_SLURM_GPU_PARTITION": cluster.GPU_PARTITION,
           "QREWRITE_SLURM_ACCOUNT": cluster.ACCOUNT, "QREWRITE_SLURM_GPU_MODEL": cluster.GPU_TYPE,
           "QREWRITE_SLURM_GPUS": "1", "QREWRITE_SLURM_GPU_CPUS": str(gpu_cpus),
           "QREWRITE_APPTAINER_LOG": str(apptainer_log), "QREWRITE_APPTAINER_BIND": "/models"}
    start = time.time()
    # the literal command, plus a shorter first status poll than a real cluster wants (40 s)
    proc = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--profile", "slurm",
                           "--slurm-init-seconds-before-status-checks", "2", *targets],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    wall = time.time() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"snakemake --profile slurm failed ({proc.returncode}):\n{out[-12000:]}"

    # --- outputs -------------------------------------------------------------------------------------
    teacher = [json.loads(l) for l in (root / p["teacher"]).read_text(encoding="utf-8").splitlines()]
    assert len(teacher) == N_QUERIES and all(r["status"] == "ok" for r in teacher), "attempt 2 got every rewrite"
    summary = json.loads((root / p["summary"]).read_text(encoding="utf-8"))
    assert summary, "empty summary"
    for key in ("train", "val", "test"):
        assert (root / p[key]).stat().st_size > 0, key
    assert (root / BASE_MODEL / "config.json").is_file()
    assert (root / p["sft_model"] / "adapter_model.safetensors").is_file()
    served = [r["status"] for r in fake_openai.requests()]
    assert served == [503] * N_QUERIES + [200] * N_QUERIES, served

    # --- Slurm's accounting of this run ------------------------------------------------------------------
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    jobs = slurm.sacct(run_id)
    by_rule: dict[str, list[dict]] = {}
    for j in jobs:
        by_rule.setdefault(re.match(r"rule_([a-z_]+?)(_wildcards_.*)?$", j["Comment"]).group(1), []).append(j)
    assert sorted(by_rule) == sorted(DATA_RULES + SWIFT_RULES), by_rule
    first, second = sorted(by_rule["teacher"], key=lambda j: int(j["JobID"]))
    assert (first["State"], second["State"]) == ("FAILED", "COMPLETED"), by_rule["teacher"]
    assert (first["ReqMem"], second["ReqMem"]) == ("2000M", "4000M"), "memory grows per attempt (profile)"
    for rule, js in by_rule.items():
        assert js[-1]["State"] == "COMPLETED", (rule, js)
        if rule != "teacher":
            assert len(js) == 1, (rule, js)
        for j in js:
            assert j["Account"] == cluster.ACCOUNT, j
            assert j["Partition"] == (cluster.GPU_PARTITION if rule == "sft" else cluster.CPU_PARTITION), j
    sft = by_rule["sft"][0]
    assert f"gres/gpu:{cluster.GPU_TYPE}=1" in sft["AllocTRES"] and int(sft["AllocCPUS"]) == gpu_cpus, sft

    # --- inside the jobs: container command lines and the {threads} / --cpus-per-task pitfall ---------
    calls = [json.loads(l) for l in apptainer_log.read_text().splitlines()]
    assert sorted(c["slurm_job_id"] for c in calls) == sorted(j["JobID"] for j in jobs), "one container call per job"
    for c in calls:
        rule = re.search(r"qrewrite (\S+)", c["argv"][-1]).group(1).replace("-", "_")  # tests/test_stage_table.py
        image = "containers/swift.sif" if rule in SWIFT_RULES else "containers/cpu.sif"
        assert c["argv"][0] == "--home" and "--nv" in c["argv"] and c["image"] == image, c
        # Slurm >= 22.05: srun no longer inherits --cpus-per-task; the step must get what the job asked for
        assert c["slurm_cpus_per_task"] == c["threads"], c
        if rule == "sft":
            assert c["threads"] == str(gpu_cpus) and c["cuda_visible_devices"] == "0", c
        # the teacher's key, exported where `snakemake --profile slurm` ran, reaches every job's container by name
        # (sbatch passes the environment, Apptainer passes it in: docs/cluster.md "API keys")
        assert "OPENAI_API_KEY" in c["key_env_names"], c
        # the profile binds QREWRITE_APPTAINER_BIND's paths into every container
        assert "--bind" in c["argv"] and "/models" in c["argv"][c["argv"].index("--bind") + 1], c
    import hashlib

    auth = {r.get("auth_sha256") for r in fake_openai.requests()}
    assert auth == {hashlib.sha256(b"Bearer test-key-not-secret").hexdigest()}, "the key reached the teacher API"

    completed = sum(j["State"] == "COMPLETED" for j in jobs)
    print(f"\nSLURM RUN {run_id}: wall {wall:.0f}s, jobs submitted {len(jobs)}, completed {completed}, "
          f"failed then retried {sum(j['State'] == 'FAILED' for j in jobs)}")


RAY_PROBE = ("import json, os, ray; ray.init(); "
             "print('RAY', json.dumps({'address': os.environ.get('RAY_ADDRESS'), 'nodes': len(ray.nodes()), "
             "'resources': ray.cluster_resources()}))")


@pytest.mark.slow
def test_ray_on_slurm_joins_the_allocation_and_runs_the_command(slurm, tmp_path):
    """slurm/ray_on_slurm.sh (the multi-node verl launcher) inside a real GPU job, as the executor's jobstep runs
    a rule: `srun -n1 --cpus-per-task=N --gpus=G` around it. One node here, so no workers: the head offers
    the job's CPUs and GPU to Ray, the command joins through RAY_ADDRESS, and Ray is stopped afterwards."""
    from test_reward_frameworks import train_python

    verl_bin = train_python("verl").parent  # ray lives in the verl env
    out = tmp_path / "ray.out"
    cpus = min(2, slurm.cpus)
    port = free_port()
    step = (f"srun -n1 --cpus-per-task={cpus} --gpus=1 {REPO / 'slurm' / 'ray_on_slurm.sh'} --port {port} -- "
            f"python -c \"{RAY_PROBE}\"")
    # a HOME where an earlier local ray.init() left ~/.ray/auth_token: `ray start` then turns token auth on by
    # itself, and a client given only an address failed "InvalidAuthToken" (the launcher sets one mode and token)
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    env = {**os.environ, "PATH": f"{verl_bin}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
           "HOME": str(home)}
    env.pop("RAY_AUTH_MODE", None)
    env.pop("RAY_AUTH_TOKEN", None)
    proc = subprocess.run(["sbatch", "--wait", "--parsable", "-p", cluster.GPU_PARTITION, "-A", cluster.ACCOUNT,
                           f"--gpus={cluster.GPU_TYPE}:1", "-c", str(cpus), "--mem", "4000", "-t", "5",
                           "-o", str(out), "--wrap", step], env=env, capture_output=True, text=True, timeout=330)
    log = out.read_text(errors="replace") if out.exists() else ""
    assert proc.returncode == 0, f"sbatch --wait: {proc.returncode} {proc.stderr}\n{log[-5000:]}"
    probe = json.loads(next(l for l in log.splitlines() if l.startswith("RAY "))[4:])
    assert probe["nodes"] == 1 and probe["address"].endswith(f":{port}"), probe
    assert probe["resources"]["CPU"] == cpus and probe["resources"]["GPU"] == 1, probe
    assert "1 node(s) joined" in log, log[-3000:]
