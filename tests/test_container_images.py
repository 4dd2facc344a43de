"""The images, built from the project's recipes, and the pipeline run inside them.

`scripts/containers.py build cpu swift` (what `make containers` runs) builds the cpu and swift images with podman
(cold: a debootstrap root filesystem, then every layer; warm: podman's layer cache). Then, with no network
(`--network none`) and the project mounted:

* the data half of the demo tenant fivedoctors runs in the cpu image (Snakemake itself in the image), and the
  same data half runs on the host: the deterministic outputs (results/T/*.jsonl and the SFT splits) must be
  byte-identical (teacher.jsonl but for each call's measured `latency_s`), and every stats file records the
  image it ran in (the host's: none);
* the base model, a 2-step LoRA SFT of the tests' SmolLM2 and its merge run in the swift image: each model's
  lineage.json carries the swift image's digest, `qrewrite lineage verify` accepts it, and reports the model
  once the image its rule names (config `containers.swift`) is another one;
* the verl image's recipe runs up to pip's resolution of its pins (a CUDA build: not installed here).

Needs podman, runc and debootstrap (root): .ci/run installs them (make container-tools). Without them the tests
skip, with a warning, unless QREWRITE_REQUIRE_CONTAINERS=1 (set by .ci/run), when they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from conftest import REPO, Project
from qrewrite.config import load_config
from qrewrite.lineage.container import OCI_PREFIX
from qrewrite.paths import BASE_MODEL, tenant_paths
from qrewrite.workflow.stages import STAGES, command, job_files, resolve
from test_pipeline_e2e import TINY

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "containers.py"
REQUIRE = "QREWRITE_REQUIRE_CONTAINERS"
TENANT = "fivedoctors"
# The image the test config names for the swift rules: a tag of its own, moved to another image to check verify.
NAMED = "localhost/qrewrite-test-named:swift"
TIMES: dict[str, float] = {}


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "containers/containers.conf")}
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=env)
    assert not check or proc.returncode == 0, proc.stderr[-3000:]
    return proc


def image_id(ref: str) -> str:
    return "sha256:" + podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def timed(name: str, cmd: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    start = time.monotonic()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    TIMES[name] = round(time.monotonic() - start, 1)
    assert proc.returncode == 0, f"{name}: {' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def in_image(image: str, *cmd: str, cwd: Path, name: str | None = None, check: bool = True):
    argv = [sys.executable, str(SCRIPT), "run", image, "--", *cmd]
    if name:
        return timed(name, argv, cwd)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert not check or proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def images():
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed (make container-tools)"
        if os.environ.get(REQUIRE):
            pytest.fail(f"{msg}, and {REQUIRE} is set")
        msg = f"SKIPPED: {msg}; set {REQUIRE}=1 to make this a failure"
        print(msg)
        warnings.warn(msg)
        pytest.skip(msg)
    proc = timed("build cpu swift", [sys.executable, str(SCRIPT), "build", "cpu", "swift"], REPO, timeout=5400)
    print(proc.stdout[-1500:])
    refs = {"cpu": "localhost/qrewrite-cpu:latest", "swift": "localhost/qrewrite-swift:cpu"}
    yield {name: {"ref": ref, "id": image_id(ref)} for name, ref in refs.items()}
    print("times (s):", json.dumps(TIMES))


def stage_argv(name: str, cfg: dict, threads: int = 2) -> list[str]:
    """The stage's command line as its Snakemake rule runs it (qrewrite.workflow.stages.command)."""
    s = STAGES[name]
    tenant = None if s.per == "once" else next(t for t in cfg["tenants"] if t["name"] == TENANT)
    tname = tenant["name"] if tenant else ""
    line = command(s, job_files(s, "in", tenant, cfg), job_files(s, "out", tenant, cfg),
                   lambda key: resolve(key, tname, {}, cfg), config="config.yaml", tenant=tname, threads=threads)
    return line.split()


def outputs(name: str, cfg: dict) -> list[str]:
    s = STAGES[name]
    tenant = None if s.per == "once" else next(t for t in cfg["tenants"] if t["name"] == TENANT)
    out = job_files(s, "out", tenant, cfg)
    return [p for v in out.values() for p in (v if isinstance(v, list) else [v])]


def make_project(root: Path) -> Project:
    project = Project(root)
    cfg = project.config
    cfg.update(TINY)
    cfg["containers"] = {"cpu": f"{OCI_PREFIX}localhost/qrewrite-cpu:latest", "swift": f"{OCI_PREFIX}{NAMED}",
                         "verl": "containers/verl.sif"}
    project.set_config(cfg)
    project.keep_queries(TENANT, 60)
    project.update_tenant(TENANT, student="always")  # the images' plumbing, not quality: no floor of training rows
    return project


def snakemake_data(root: Path) -> list[str]:
    return ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(root), "--configfile", str(root / "config.yaml"),
            "--cores", "2", "data", "--config", f"only={TENANT}"]


@pytest.fixture(scope="module")
def runs(images, tmp_path_factory):
    base = tmp_path_factory.mktemp("containers")
    host, image = make_project(base / "host"), make_project(base / "image")
    timed("data half on the host", snakemake_data(host.root), host.root)
    in_image("cpu", *snakemake_data(image.root), cwd=image.root, name="data half in the cpu image")
    podman("tag", images["swift"]["ref"], NAMED)
    try:
        cfg = load_config(image.config_path)
        for name, stage in (("cpu", "training_gate"), ("cpu", "sft_targets"), ("swift", "base_model"),
                            ("swift", "sft"), ("swift", "merge_sft")):
            for out in outputs(stage, cfg):  # as Snakemake does before a job: the outputs' folders exist
                (image.root / out).parent.mkdir(parents=True, exist_ok=True)
            in_image(name, *stage_argv(stage, cfg), cwd=image.root, name=f"{stage} in the {name} image")
        yield {"host": host.root, "image": image.root, "cfg": cfg}
    finally:
        podman("untag", NAMED, NAMED, check=False)  # that name only (without it: every name of the image)


def test_images_hold_their_environment_and_no_network(images, tmp_path):
    """The cpu image has no torch; the swift image has the CPU torch build and no nvidia-* wheels (a CUDA build
    was never pulled); `run` gives a container no network interface but loopback."""
    probe = ("import importlib.util as u, importlib.metadata as m, os; print(os.listdir('/sys/class/net'), "
             "u.find_spec('torch') is not None, sorted(d.metadata['Name'] for d in m.distributions() "
             "if d.metadata['Name'].startswith('nvidia')))")
    assert in_image("cpu", "python", "-c", probe, cwd=tmp_path).stdout.split("\n")[0] == "['lo'] False []"
    assert in_image("swift", "python", "-c", probe, cwd=tmp_path).stdout.split("\n")[0] == "['lo'] True []"
    torch = in_image("swift", "python", "-c", "import torch; print(torch.__version__, torch.version.cuda)",
                     cwd=tmp_path).stdout.split()
    assert torch[:2] == ["2.13.0+cpu", "None"]


def test_data_half_in_the_cpu_image_is_byte_identical_to_the_host(runs, images):
    p = tenant_paths(TENANT)
    results = Path(p["queries"]).parent
    files = sorted(f.relative_to(runs["host"]) for f in (runs["host"] / results).glob("*.jsonl"))
    files += [Path(p[k]) for k in ("train", "val", "test")]
    assert {f.name for f in files} >= {"queries.jsonl", "teacher.jsonl", "validated.jsonl", "train.jsonl",
                                       "val.jsonl", "test.jsonl"}
    for f in files:
        host, image = (runs["host"] / f).read_bytes(), (runs["image"] / f).read_bytes()
        if f.name == "teacher.jsonl":  # each call's measured wall time: it differs between two host runs too
            host, image = (re.sub(rb'"latency_s": [0-9.e-]+', b'"latency_s": _', x) for x in (host, image))
        assert host and host == image, f"{f} differs between the host and the cpu image"
    ran = {"runtime": "podman", "image": f"{OCI_PREFIX}{images['cpu']['ref']}", "digest": images["cpu"]["id"]}
    for stage in ("ingest", "teacher", "validate", "split"):
        assert json.loads((runs["image"] / p[f"stats_{stage}"]).read_text())["container"] == ran, stage
        assert json.loads((runs["host"] / p[f"stats_{stage}"]).read_text())["container"] is None, stage


def test_models_trained_in_the_swift_image_carry_its_digest(runs, images):
    root, p = runs["image"], tenant_paths(TENANT)
    ran = {"runtime": "podman", "image": f"{OCI_PREFIX}{images['swift']['ref']}", "digest": images["swift"]["id"]}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    for model in (BASE_MODEL, p["sft_model"], p["sft_merged"]):
        doc = json.loads((root / model / "lineage.json").read_text())
        assert doc["env"]["container"] == ran, model
        assert doc["env"]["name"] == "swift" and doc["code"]["git_commit"] == commit, model
    gguf = json.loads((root / BASE_MODEL / "lineage.json").read_text())["inputs"]["gguf"]
    assert gguf["in_image"] and gguf["path"].startswith("/opt/venv/")  # verified through the image's digest
    sft = json.loads((root / p["stats_sft"]).read_text())
    assert sft["steps"] == 2 and sft["container"] == ran


def test_verify_reports_a_model_trained_in_another_image_than_its_rule_names(runs, images):
    root, merged = runs["image"], tenant_paths(TENANT)["sft_merged"]

    def verify():
        return subprocess.run([sys.executable, "-m", "qrewrite", "lineage", "verify", merged], cwd=root,
                              capture_output=True, text=True, timeout=300)

    ok = verify()
    assert ok.returncode == 0 and ok.stdout.startswith(f"OK {merged}"), ok.stderr[-2000:]
    podman("tag", images["cpu"]["ref"], NAMED)  # the rule's image is now another one
    bad = verify()
    assert bad.returncode == 2
    named = f"{OCI_PREFIX}{NAMED}"
    assert f"MISMATCH {named}: rule base_model ran in image {images['swift']['id'][:19]}" in bad.stderr
    assert f"but the image it names is {images['cpu']['id'][:19]}" in bad.stderr
    assert f"{named} no longer matches" in bad.stderr


def test_verl_image_pins_resolve_for_its_python(images):
    """The verl image (CUDA, vLLM) is a cluster build. Here its recipe runs up to pip's resolution of its pins
    (envs/verl-gpu.txt + envs/verl.txt in one pass, `--resolve-only`) for the image's Python: every pin must be
    what pip would install, and a conflict, which would fail the cluster's build, fails here."""
    proc = timed("verl resolve-only", [sys.executable, str(SCRIPT), "build", "verl", "--resolve-only"], REPO)
    assert "verl image: pip resolves" in proc.stdout
    report = podman("run", "--rm", "--network", "none", "localhost/qrewrite-verl:resolved", "cat",
                    "/opt/qrewrite/resolved.json").stdout
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731  (PEP 503 names)
    got = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report)["install"]}
    pins = {}
    for f in ("verl-gpu.txt", "verl.txt"):
        for line in (REPO / "envs" / f).read_text(encoding="utf-8").splitlines():
            m = re.match(r"^([A-Za-z0-9_.\[\]-]+)==(\S+)", line)
            if m:
                pins[norm(m.group(1).split("[")[0])] = m.group(2)
    assert {"torch", "vllm", "verl", "numpy"} <= set(pins)
    assert {name: got.get(name) for name in pins} == pins


def test_a_stage_in_an_image_needs_its_digest_and_its_own_env(images, tmp_path):
    """A container started without the image's digest refuses to run a stage; a swift stage in the cpu image
    says which image it needs rather than reaching for a host venv through the mounted checkout."""
    proc = podman("run", "--rm", "--network", "none", "-v", f"{REPO}:{REPO}:ro", "-w", str(REPO),
                  images["cpu"]["id"].removeprefix("sha256:"), "qrewrite", "lineage", "show", "models/none", check=False)
    assert proc.returncode == 2 and "QREWRITE_IMAGE_DIGEST does not say which image" in proc.stderr
    proc = in_image("cpu", "qrewrite", "merge-sft", "--config", str(REPO / "config.yaml"), "--tenant", TENANT,
                    "--base", "b", "--adapter", "a", "--out", "o", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "needs the swift environment" in proc.stderr and "qrewrite-cpu" in proc.stderr
