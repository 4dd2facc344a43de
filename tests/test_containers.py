"""Lint of containers/*.def (Apptainer definition files) and of the conda env files in envs/.

Images cannot be built here (no registry), so each definition is checked the ways a build would fail early:
spython parses it, the header is valid, every section name is one Apptainer knows (a misspelt `%post` is an
error, as in `apptainer build`), and `bash -n` accepts the %post script. Every pip install reads the pins in
envs/, and every rule names its image.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO

DEFS = sorted((REPO / "containers").glob("*.def"))
# Apptainer 1.x definition-file sections (docs: "Definition Files"); %app* take an app name.
SECTIONS = {"setup", "files", "environment", "post", "runscript", "startscript", "test", "labels", "help",
            "arguments", "appfiles", "appinstall", "appenv", "apphelp", "applabels", "apprun", "appstart", "apptest"}
HEADER_KEYS = {"bootstrap", "from", "stage", "include", "includecmd", "mirrorurl", "osversion", "updateurl",
               "fingerprints", "registry", "namespace", "library", "confurl", "setopt", "product", "user", "regcode",
               "productpgp", "otherurl0", "otherurl1", "otherurl2"}
AGENTS = {"library", "docker", "shub", "oras", "localimage", "yum", "dnf", "zypper", "debootstrap", "arch",
          "busybox", "scratch", "docker-daemon", "docker-archive", "oci", "oci-archive"}
NEEDS_FROM = AGENTS - {"scratch", "busybox", "arch"}
SHELL_SECTIONS = {"post", "test", "runscript", "setup", "environment", "startscript"}


class DefError(ValueError):
    pass


def split_def(text: str, name: str = "def") -> tuple[dict[str, str], dict[str, str]]:
    """(header key → value, section → body). Raises DefError naming the line for anything `apptainer build`
    would reject: unknown section, bad or missing header, unknown bootstrap agent."""
    header: dict[str, str] = {}
    sections: dict[str, str] = {}
    current = None
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("%"):
            m = re.match(r"%(\w+)", line)
            sec = m.group(1).lower() if m else ""
            if sec not in SECTIONS:
                raise DefError(f"{name}, line {no}: unknown section {line.split()[0]!r} (Apptainer knows "
                               f"{', '.join('%' + s for s in sorted(SECTIONS))})")
            if sec in sections:
                raise DefError(f"{name}, line {no}: section %{sec} appears twice")
            current = sec
            sections[sec] = ""
            continue
        if current is not None:
            sections[current] += line + "\n"
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition(":")
        if not sep or key.strip().lower() not in HEADER_KEYS:
            raise DefError(f"{name}, line {no}: not a header line (Key: value with a known key): {line!r}")
        if not header and key.strip().lower() != "bootstrap":
            raise DefError(f"{name}, line {no}: the header must start with Bootstrap:")
        header[key.strip().lower()] = value.strip()
    if "bootstrap" not in header:
        raise DefError(f"{name}: no Bootstrap: header")
    if header["bootstrap"] not in AGENTS:
        raise DefError(f"{name}: unknown bootstrap agent {header['bootstrap']!r}")
    if header["bootstrap"] in NEEDS_FROM and not header.get("from"):
        raise DefError(f"{name}: Bootstrap {header['bootstrap']} needs a From: line")
    if "post" not in sections:
        raise DefError(f"{name}: no %post section")
    return header, sections


def bash_n(script: str, tmp_path: Path, name: str) -> None:
    f = tmp_path / f"{name}.sh"
    f.write_text(script)
    proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DefError(f"bash -n {name}: {proc.stderr.strip()}")


def pip_files(post: str) -> list[list[str]]:
    """The envs/ files of each `pip install` line in %post, in order (a line may name several)."""
    out = []
    for line in post.splitlines():
        if re.match(r"\s*pip install\b", line):
            out.append(re.findall(r"-r /opt/qrewrite/(envs/[\w.-]+)", line))
    return out


def test_there_is_an_image_per_environment():
    assert {d.stem for d in DEFS} >= {"cpu", "swift", "verl"}
    schema = yaml.safe_load((REPO / "qrewrite/schemas/config.schema.yaml").read_text(encoding="utf-8"))
    for env, spec in schema["properties"]["containers"]["properties"].items():
        assert (REPO / spec["default"]).with_suffix(".def").is_file(), f"no containers/{env}.def for {env}"


@pytest.mark.parametrize("path", DEFS, ids=lambda p: p.name)
def test_definition_parses_and_is_valid(path, tmp_path):
    from spython.main.parse.parsers import SingularityParser

    text = path.read_text(encoding="utf-8")
    header, sections = split_def(text, path.name)
    recipe = SingularityParser(str(path)).recipe["spython-base"]
    assert recipe.fromHeader == header["from"], "spython reads the same base image"
    assert recipe.install, "spython found the %post commands"
    for sec in SHELL_SECTIONS & set(sections):
        bash_n(sections[sec], tmp_path, f"{path.stem}-{sec}")
    # %files sources exist in the repo (images are built from the repo root)
    for line in sections.get("files", "").splitlines():
        if line.strip() and not line.strip().startswith("#"):
            assert (REPO / line.split()[0]).exists(), f"{path.name} %files: {line.strip()}"


@pytest.mark.parametrize("path", DEFS, ids=lambda p: p.name)
def test_every_pip_install_reads_the_pins_in_envs(path):
    """One source of truth: the images install from the same files as the venvs (Makefile)."""
    _, sections = split_def(path.read_text(encoding="utf-8"), path.name)
    post = sections["post"]
    installs = [l.strip() for l in post.splitlines() if re.match(r"\s*pip install\b", l)]
    assert installs
    for line in installs:
        args = [a for a in line.split()[2:] if not a.startswith("--")]
        # only "-r /opt/qrewrite/envs/X.txt" pairs or the qrewrite package itself
        rest = re.sub(r"-r /opt/qrewrite/envs/[\w.-]+\.txt", "", " ".join(args)).split()
        assert rest in ([], ["/opt/qrewrite"]), f"{path.name}: unpinned install {line!r}"
        for f in re.findall(r"/opt/qrewrite/(envs/[\w.-]+\.txt)", line):
            assert (REPO / f).is_file(), f"{path.name} installs {f}, which does not exist"
    files = [f for group in pip_files(post) for f in group]
    if "envs/swift.txt" in files:  # torch alone and first: nothing may pull another torch build
        assert pip_files(post)[0] == ["envs/torch.txt"], pip_files(post)
    if "envs/verl.txt" in files:  # verl's pins and its GPU stack in one resolver pass
        assert ["envs/verl-gpu.txt", "envs/verl.txt"] in pip_files(post), pip_files(post)


BROKEN = {
    "misspelt %post": lambda t: t.replace("%post", "%pots"),
    "unknown section": lambda t: t + "\n%postinstall\n    true\n",
    "no Bootstrap": lambda t: t.replace("Bootstrap: docker", ""),
    "unknown agent": lambda t: t.replace("Bootstrap: docker", "Bootstrap: dockr"),
    "unknown header key": lambda t: t.replace("From:", "Form:"),
    "no From": lambda t: re.sub(r"From: .*", "", t),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_lint_rejects_broken_definitions(breakage):
    text = BROKEN[breakage]((REPO / "containers/cpu.def").read_text(encoding="utf-8"))
    with pytest.raises(DefError):
        split_def(text, f"cpu.def ({breakage})")


def test_bash_n_rejects_a_broken_post(tmp_path):
    text = (REPO / "containers/cpu.def").read_text(encoding="utf-8").replace("set -eu", "if then fi", 1)
    _, sections = split_def(text)
    with pytest.raises(DefError, match="bash -n"):
        bash_n(sections["post"], tmp_path, "broken-post")


def test_every_rule_runs_in_the_container_and_conda_env_of_its_stage():
    """Every rule that runs a command has a `container:` (`--sdm apptainer`) and a `conda:` env (`--sdm conda`),
    the pair its stage's env names (the conda env is the one its container is built from), and the env file
    exists. Asked of Snakemake's loaded workflow, not of the rule text."""
    from conftest import snakemake_rules
    from qrewrite.config import load_config
    from qrewrite.workflow.stages import STAGES

    cfg = load_config(REPO / "config.yaml")
    rl_env = "verl" if cfg["rl"]["backend"] == "verl" else "swift"
    conda_file = {"cpu": "envs/data.yaml", "swift": "envs/swift.yaml", "verl": "envs/verl.yaml"}
    rules = snakemake_rules()
    assert set(STAGES) <= set(rules)
    for name, s in STAGES.items():
        env = rl_env if s.env == "rl" else s.env
        r = rules[name]
        assert r.container_img == cfg["containers"][env], name
        assert (REPO / "rules" / r.conda_env).resolve() == (REPO / conda_file[env]).resolve(), (name, r.conda_env)
        assert (REPO / conda_file[env]).is_file()


def _snakemake(*args: str) -> subprocess.CompletedProcess:
    import os
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([str(Path(sys.executable).parent / "snakemake"), *args], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=300)


def test_snakemake_lint_is_clean():
    proc = _snakemake("--lint")
    assert proc.returncode == 0 and "in a good condition" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]


def test_sdm_conda_dry_run_plans():
    """`snakemake --sdm conda -n` plans every job. Snakemake runs `conda info` even for a dry run, so this needs
    conda on PATH: without it the test skips, with a warning, unless QREWRITE_REQUIRE_CONDA=1 (then it fails),
    as test_reward_frameworks does for the training envs."""
    import os
    import shutil
    import warnings

    if shutil.which("conda") is None:
        msg = "no conda on PATH, and snakemake --sdm conda -n runs `conda info` even dry"
        if os.environ.get("QREWRITE_REQUIRE_CONDA"):
            pytest.fail(f"{msg}, and QREWRITE_REQUIRE_CONDA is set")
        msg = f"SKIPPED: {msg}; set QREWRITE_REQUIRE_CONDA=1 to make this a failure"
        print(msg)
        warnings.warn(msg)
        pytest.skip(msg)
    proc = _snakemake("--sdm", "conda", "-n")
    assert proc.returncode == 0 and "This was a dry-run" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.parametrize("name", ["data", "swift", "verl"])
def test_conda_env_files_use_the_same_pins(name):
    env = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text(encoding="utf-8"))
    deps = env["dependencies"]
    assert "python=3.11" in deps and "pip" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    reqs = [p.split()[1] for p in pip if p.startswith("-r ")]
    assert reqs and all((REPO / "envs" / r).is_file() for r in reqs), reqs
    assert f"{name}.txt" in reqs
    assert "-e .." in pip, "qrewrite itself (no dependencies of its own)"
    if name == "swift":
        assert reqs[0] == "torch.txt"
        post = REPO / "envs" / "swift.post-deploy.sh"
        assert "model-nodeps.txt" in post.read_text() and subprocess.run(["bash", "-n", str(post)]).returncode == 0
