"""Lint of the image recipes (containers/*.Containerfile) and of the conda env files in envs/.

The images are built and run by tests/test_container_images.py (cpu and swift). The verl image (CUDA, vLLM)
is a cluster build, so for it the checks here are what this machine can check: every recipe is split into
Dockerfile instructions the way the builder reads them (continuation lines, comments), an unknown instruction
is an error, every RUN passes `bash -n`, every COPY source exists, every pip install reads the pins in envs/,
every image builds FROM the shared base, and each image's stages label is the stage table's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

RECIPES = sorted((REPO / "containers").glob("*.Containerfile"))
IMAGES = ("cpu", "swift", "verl")
# Dockerfile reference, "Overview": every instruction there is.
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


class RecipeError(ValueError):
    pass


def instructions(text: str, name: str = "Containerfile") -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) as the builder reads them: a trailing backslash continues the line, and
    comment lines inside a continued instruction are dropped. An unknown instruction raises RecipeError naming
    the line, as `podman build` fails on it."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = no
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full, pending = pending + stripped, ""
        word, _, args = full.partition(" ")
        if word.upper() not in INSTRUCTIONS:
            raise RecipeError(f"{name}, line {start}: unknown instruction {word!r}")
        out.append((start, word.upper(), args.strip()))
    if pending:
        raise RecipeError(f"{name}: the last instruction ends with a line continuation")
    if not out or out[0][1] not in ("FROM", "ARG") or not any(i == "FROM" for _, i, _ in out):
        raise RecipeError(f"{name}: no FROM before the first instruction (only ARG may come first)")
    return out


def arg_default(ins: list, name: str) -> str | None:
    for _, i, args in ins:
        if i == "ARG" and args.partition("=")[0] == name:
            return args.partition("=")[2] or None
    return None


def bash_n(script: str, tmp_path: Path, name: str) -> None:
    f = tmp_path / f"{name}.sh"
    f.write_text(script)
    proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RecipeError(f"bash -n {name}: {proc.stderr.strip()}")


def pip_installs(ins: list) -> list[list[str]]:
    """The pip arguments of each `pip install` in the RUN instructions, in order."""
    out = []
    for _, i, args in ins:
        if i != "RUN":
            continue
        lex = shlex.shlex(args, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words: list[str] = []
        for tok in [*lex, ";"]:
            if tok in ("&&", "||", ";", ";;", "|", ")", "(") or tok.endswith(")") and tok[:-1] in ("cpu", "cuda", "*"):
                if words[:2] == ["pip", "install"]:
                    out.append(words[2:])
                words = []
            else:
                words.append(tok)
    return out


def load(path: Path) -> list:
    return instructions(path.read_text(encoding="utf-8"), path.name)


def test_there_is_a_recipe_per_image_and_each_builds_on_the_base():
    """An image per environment of config `containers:`; each FROM the shared base, the base FROM the
    debootstrap root filesystem, with the names scripts/containers.py builds them under."""
    from scripts import containers as build

    schema = yaml.safe_load((REPO / "qrewrite/schemas/config.schema.yaml").read_text(encoding="utf-8"))
    assert set(schema["properties"]["containers"]["properties"]) == set(IMAGES) == set(build.IMAGES)
    assert {p.stem for p in RECIPES} == {*IMAGES, "base"}
    base = load(REPO / "containers/base.Containerfile")
    assert [a for _, i, a in base if i == "FROM"] == ["${ROOTFS}"] and arg_default(base, "ROOTFS") == build.ROOTFS
    for name in IMAGES:
        ins = load(REPO / f"containers/{name}.Containerfile")
        assert [a for _, i, a in ins if i == "FROM"] == ["${BASE}"] and arg_default(ins, "BASE") == build.BASE, name


def test_remove_names_every_image_the_script_builds_and_the_layers_they_stand_on_last():
    """`scripts/containers.py remove` (CI, after the tests): each recipe's image at either torch build and resolved,
    then the base and the root filesystem, which the others build on."""
    from scripts import containers as build

    refs = build.built_refs()
    assert refs[-2:] == [build.BASE, build.ROOTFS] and len(refs) == len(set(refs))
    for name in build.IMAGES:
        for torch in ("cpu", "cuda"):
            assert build.ref(name, torch) in refs and build.ref(name, torch, resolved=True) in refs


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_and_its_commands_are_valid(path, tmp_path):
    ins = load(path)
    for no, i, args in ins:
        if i == "RUN":
            bash_n(args, tmp_path, f"{path.stem}-{no}")
        if i == "COPY":  # sources relative to the build context, the repo root
            for src in shlex.split(args)[:-1]:
                if not src.startswith("--"):
                    assert (REPO / src).exists(), f"{path.name}, line {no}: COPY {src}: no such file"


@pytest.mark.parametrize("name", IMAGES)
def test_every_pip_install_reads_the_pins_in_envs(name):
    """One source of truth: the images install from the same files as the venvs (Makefile), COPY'd in."""
    ins = load(REPO / f"containers/{name}.Containerfile")
    copied = {Path(s).name for _, i, a in ins if i == "COPY" for s in shlex.split(a)[:-1] if s.startswith("envs/")}
    installs = pip_installs(ins)
    assert installs
    files = []
    for args in installs:
        reqs = [args[k + 1] for k, a in enumerate(args) if a == "-r"]
        rest = [a for k, a in enumerate(args) if not a.startswith(("--", "${")) and a != "-r" and args[k - 1] != "-r"
                and args[k - 1] not in ("--find-links", "--report")]
        assert reqs and not rest, f"{name}: unpinned install: pip install {' '.join(args)}"
        for r in reqs:
            assert r.startswith("/opt/qrewrite/envs/") and Path(r).name in copied, f"{name}: {r} is not COPY'd"
            assert (REPO / "envs" / Path(r).name).is_file()
        files.append([Path(r).name for r in reqs])
    if name == "swift":  # torch alone and first: nothing may pull another torch build
        assert files[0] == ["torch.txt"] and ["swift.txt"] in files and ["model-nodeps.txt"] in files, files
    if name == "verl":  # verl's pins and its GPU stack in one resolver pass
        assert ["verl-gpu.txt", "verl.txt"] in files, files
    if name == "cpu":
        assert files == [["data.txt"]], files


def test_cpu_torch_comes_only_from_the_local_wheels():
    """TORCH=cpu installs torch with --no-index from the mounted wheel folder (PyPI would give the CUDA build)."""
    ins = load(REPO / "containers/swift.Containerfile")
    first = pip_installs(ins)[0]
    assert {"--no-index", "--no-deps"} <= set(first) and first[first.index("--find-links") + 1] == "/wheels"


@pytest.mark.parametrize("name", IMAGES)
def test_stages_label_is_the_stage_tables(name):
    """The image's `org.qrewrite.stages` label lists the stages whose env it is (rl under its backend)."""
    from qrewrite.workflow.stages import STAGES

    label = next(a for _, i, a in load(REPO / f"containers/{name}.Containerfile") if i == "LABEL")
    stages = set(shlex.split(re.search(r'org\.qrewrite\.stages=("[^"]*")', label).group(1))[0].split())
    want = {s.name for s in STAGES.values() if s.env == name}
    want |= {"rl(swift-grpo)"} if name == "swift" else {"rl(verl)"} if name == "verl" else {"serve-rag"}
    assert stages == want


BROKEN = {
    "unknown instruction": lambda t: t.replace("RUN pip", "RUNN pip", 1),
    "dangling continuation": lambda t: t.rstrip("\n") + " \\\n",
    "no FROM": lambda t: re.sub(r"(?m)^FROM .*$", "", t),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_lint_rejects_broken_recipes(breakage):
    text = BROKEN[breakage]((REPO / "containers/cpu.Containerfile").read_text(encoding="utf-8"))
    with pytest.raises(RecipeError):
        instructions(text, f"cpu.Containerfile ({breakage})")


def test_bash_n_rejects_a_broken_run(tmp_path):
    text = (REPO / "containers/cpu.Containerfile").read_text(encoding="utf-8").replace("&& pip check", "&& if then", 1)
    run = next(a for _, i, a in instructions(text) if i == "RUN")
    with pytest.raises(RecipeError, match="bash -n"):
        bash_n(run, tmp_path, "broken-run")


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
    from qrewrite.workflow.stages import switched_on

    rules = snakemake_rules()
    # a stage the config switches off (its `switch`, e.g. pref.enabled) has no rule; every other stage has one
    off = {n for n, s in STAGES.items() if s.switch and not switched_on(cfg, s.switch)}
    assert set(STAGES) - off <= set(rules) and not off & set(rules)
    for name, s in STAGES.items():
        if name in off:
            continue
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


def test_a_cpu_build_without_the_cpu_torch_wheel_stops_before_building(tmp_path):
    """`scripts/containers.py build swift` (--torch cpu) needs the CPU wheel of envs/torch.txt's torch in a local
    folder; without it, it stops naming what to do, before podman runs (it never falls back to PyPI's CUDA build)."""
    version = re.search(r"^torch==(\S+)", (REPO / "envs/torch.txt").read_text(), re.M).group(1)
    (tmp_path / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")  # a CUDA build's name
    proc = subprocess.run([sys.executable, str(REPO / "scripts/containers.py"), "build", "swift", "--wheels",
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"no CPU torch wheel (torch-{version}+cpu-*.whl)" in proc.stderr, proc.stderr
    assert "--torch cuda" in proc.stderr and "podman" not in proc.stdout
