"""The suite's own guards (tests/conftest.py): under QREWRITE_STRICT_SKIPS=1, as .ci/run sets it, a skipped test fails
the run unless ALLOWED_SKIPS names it; QREWRITE_TEST_PROFILE gets the per-file time table; a file that passed frees
its tmp folders when it ends. Each runs pytest on a scratch copy of the conftest with tiny tests, in a subprocess.
And the Makefile a newcomer reads: `make` alone lists every target, the user-facing ones first (make, in a subprocess)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from conftest import PROFILE_ENV, REPO, STRICT_SKIPS_ENV, TESTS

SCRATCH_TESTS = '''
import time

import pytest

def test_passes():
    time.sleep(0.3)  # a known duration: the profile must record at least it
    assert True

def test_skips():
    pytest.skip("a tool is missing")
'''


def run_pytest(tmp_path, *args: str, files: dict | None = None, **env) -> subprocess.CompletedProcess:
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    for name, text in (files or {"test_scratch.py": SCRATCH_TESTS}).items():
        (tests / name).write_text(text)
    clean = {k: v for k, v in os.environ.items() if k not in (STRICT_SKIPS_ENV, PROFILE_ENV)}
    # the copied conftest imports the loopback servers as `tests.servers`: the repo's tests/ joins this one's
    # namespace package through the path
    path = os.pathsep.join(p for p in (str(TESTS.parent), clean.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tests)],
                          cwd=tmp_path, env={**clean, "PYTHONPATH": path, **env}, capture_output=True, text=True,
                          timeout=120)


def test_a_skip_ci_does_not_list_fails_the_strict_run(tmp_path):
    proc = run_pytest(tmp_path, **{STRICT_SKIPS_ENV: "1"})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "test_scratch.py::test_skips: Skipped: a tool is missing" in proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout


def test_without_the_strict_setting_a_skip_is_reported_not_failed(tmp_path):
    proc = run_pytest(tmp_path)
    assert proc.returncode == 0 and "1 passed, 1 skipped" in proc.stdout, proc.stdout[-2000:]


def test_the_profile_lists_each_file_with_its_tests_and_times(tmp_path):
    out = tmp_path / "profile.json"
    proc = run_pytest(tmp_path, **{PROFILE_ENV: str(out)})
    assert proc.returncode == 0 and "time per test file" in proc.stdout, proc.stdout[-2000:]
    doc = json.loads(out.read_text())
    [row] = doc["files"]
    assert row["file"].endswith("test_scratch.py") and row["tests"] == 2 and row["skipped"] == 1
    # the sleeping test's 0.3 s is in its call time, the file's total and the session's wall clock
    assert row["total"] >= row["call"] >= 0.3 and doc["wall_s"] >= 0.3, row


# a module fixture's folder (a trained model, a project), a function's tmp_path, and a folder the next file reads
MAKES_FOLDERS = '''
import pytest

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("{name}_model")
    (d / "weights").write_bytes(b"w" * 1000)
    return d

def test_reads_it(model, tmp_path):
    (tmp_path / "out").write_text("x")
    assert {verdict}
'''


def test_a_file_that_passed_frees_its_tmp_folders_and_one_that_failed_keeps_them(tmp_path):
    base = tmp_path / "base"
    proc = run_pytest(tmp_path, "--basetemp", str(base), "-o", "tmp_path_retention_policy=failed", files={
        "test_a_passes.py": MAKES_FOLDERS.format(name="passed", verdict="(model / 'weights').is_file()"),
        "test_b_fails.py": MAKES_FOLDERS.format(name="failed", verdict="False")})
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:]
    left = {p.name for p in base.iterdir()}
    assert not any(n.startswith("passed_model") for n in left), left
    assert any(n.startswith("failed_model") for n in left), left


# ---- the Makefile's help --------------------------------------------------------------------------------------------

USER_GROUP, INTERNAL_GROUP = "user", "internal (CI, tests, GPU kit)"


def run_make(*args: str) -> subprocess.CompletedProcess:
    """make in the repo, without what a calling make (`make test`) or the shell would pass down."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "T")}
    return subprocess.run(["make", *args], cwd=REPO, env=clean, capture_output=True, text=True, timeout=60)


def help_groups(text: str) -> list[tuple[str, list[str]]]:
    """`make help`'s groups in order: (header, the targets listed under it, in order)."""
    groups: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            groups.append((line[:-1], []))
        elif line.startswith("  ") and groups:
            target, _, what = line.strip().partition(" ")
            assert what.strip(), f"`{target}` has no help text: {line!r}"
            groups[-1][1].append(target)
    return groups


def test_make_alone_lists_every_phony_target_once_the_user_facing_ones_first():
    """`make` (the default goal, `make help`) prints each target with its `## ` line: the user group, then the
    internal one; every .PHONY target appears exactly once, and nothing else does."""
    proc = run_make("-s")
    assert proc.returncode == 0, proc.stderr
    assert run_make("-s", "help").stdout == proc.stdout
    groups = help_groups(proc.stdout)
    assert [g for g, _ in groups] == [USER_GROUP, INTERNAL_GROUP], proc.stdout
    user, internal = (set(ts) for _, ts in groups)
    assert {"help", "setup", "run", "run-quick", "serve", "report", "lineage", "test", "test-fast", "clean"} <= user
    assert {"gpu-kit", "gpu-rehearsal-run", "containers-remove", "test-tools"} <= internal
    listed = [t for _, ts in groups for t in ts]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    phony = [t for line in re.findall(r"^\.PHONY:(.*)$", makefile, flags=re.M) for t in line.split()]
    assert len(phony) == len(set(phony)), phony
    assert sorted(listed) == sorted(phony), (sorted(set(listed) ^ set(phony)), proc.stdout)


def test_make_lineage_without_a_tenant_says_how_to_name_one():
    proc = run_make("-s", "lineage")
    assert proc.returncode != 0
    assert "make lineage T=fivedoctors" in proc.stderr, proc.stderr
    dry = run_make("-n", "lineage", "T=fivedoctors")
    assert dry.returncode == 0, dry.stderr
    assert ".venv/bin/qrewrite lineage show models/fivedoctors/release" in dry.stdout, dry.stdout


def test_make_setup_builds_every_env_and_trains_nothing():
    """A dry run with every target out of date (-B): the data and test envs in .venv and both training envs."""
    proc = run_make("-n", "-B", "setup")
    assert proc.returncode == 0, proc.stderr
    touched = re.findall(r"^touch (\S+)$", proc.stdout, flags=re.M)
    assert sorted(touched) == sorted([".venv/.data-env", ".venv/.test-env", ".venvs/swift/.installed",
                                      ".venvs/verl/.installed"]), proc.stdout
    assert "snakemake" not in proc.stdout, proc.stdout
