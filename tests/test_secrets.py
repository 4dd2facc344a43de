"""API keys come from the environment only and end up in nothing the pipeline writes or prints.

The pipeline runs (real Snakemake, in a scratch copy of the project) with the teacher, the RAG
service and the RL judge all needing a key, every key the same sentinel, set only in the
environment. The test OpenAI server (tests/fake_openai_server.py, a TEST FAKE) quotes the
Authorization header back in its error bodies, as some services do, so the key reaches the
pipeline's error paths too. Then every file the run produced -- in the project, in $HOME and in
$TMPDIR -- and everything it printed is searched for the key.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from qrewrite.paths import tenant_paths

TENANT = "fivedoctors"
PATHS = tenant_paths(TENANT)
KEY_ENV = "QR_SENTINEL_KEY"
SENTINEL = "sk-qrewrite-SENTINEL-7f3c9a1e5b2d4c6f8a0b1d2e3f4a5b6c"

# The data half, with the teacher and the RAG service behind keys. The training and eval half (RL judge, API
# eval candidate; TensorBoard events, lineage, reports) is searched the same way in test_pipeline_e2e.
SNAKEMAKE_TARGETS = [PATHS["summary"], PATHS["train"], PATHS["val"], PATHS["test"]]

# After Snakemake: an RL reward-scoring pass with the OpenAI judge (writes cache/reward/{rag,judge}).
REWARD_PASS = r"""
import json, sys
from qrewrite.io_utils import read_jsonl, write_json
from qrewrite.reward.adapter import get_scorer
from qrewrite.reward.scorer import RewardSample

teacher = {r["id"]: r for r in read_jsonl("results/fivedoctors/teacher.jsonl")}
samples = []
for v in read_jsonl("results/fivedoctors/validated.jsonl")[:12]:
    t = v["rewrite_rag"]
    for rollout in (v["rewrite"], v["query"], v["rewrite"] + " 用法"):
        samples.append(RewardSample(query_id=v["id"], query=v["query"], rollout=rollout,
                                    teacher_rewrite=v["rewrite"], teacher_top1=t["top1"],
                                    teacher_mean_top3=t["mean_top3"], gold_doc_ids=v["gold_doc_ids"]))
scorer = get_scorer("fivedoctors", "config.yaml")
rewards = scorer.score_batch(samples)
stats = scorer.stats()
scorer.close()
write_json("results/fivedoctors/reward_pass.json", {"rewards": rewards, "stats": stats})
print(json.dumps(stats), file=sys.stderr)
"""


def needles(secret: str) -> dict[str, bytes]:
    """The forms a leaked key could take in a file: as is, its head or tail (a truncated copy), base64
    (of the key and of an Authorization header value), UTF-16."""
    return {"raw": secret.encode(), "head": secret[:28].encode(), "tail": secret[-20:].encode(),
            "base64": base64.b64encode(secret.encode()),
            "base64-bearer": base64.b64encode(f"Bearer {secret}".encode()),
            "utf16": secret.encode("utf-16-le")}


def leaks(roots: list[Path], texts: dict[str, str]) -> list[str]:
    found = []
    forms = needles(SENTINEL)
    n_files = 0
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file() and not f.is_symlink():
                n_files += 1
                data = f.read_bytes()
                found += [f"{f} ({form})" for form, b in forms.items() if b in data]
    for name, text in texts.items():
        found += [f"{name} ({form})" for form, b in forms.items() if b in text.encode()]
    assert n_files > 20, f"only {n_files} files searched: the run did not produce what it should"
    return found


@pytest.fixture
def env_dirs(tmp_path) -> dict:
    """A private HOME and TMPDIR, so files written outside the project are searched too."""
    home, tmp = tmp_path / "home", tmp_path / "tmpdir"
    home.mkdir()
    tmp.mkdir()
    return {"HOME": str(home), "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(home / ".cache")}


def _configure(project, fake_url: str, rag_url: str) -> None:
    project.keep_queries(TENANT, 40)
    project.keep_queries("chengla", 10)
    openai_cfg = {"base_url": fake_url, "model": "test-model", "api_key_env": KEY_ENV, "backoff_base_s": 0.0,
                  "timeout_s": 10}
    project.update(teacher={"provider": "openai", "concurrency": 4, "openai": openai_cfg},
                   rag={"provider": "http", "http": {"base_url": rag_url, "api_key_env": KEY_ENV,
                                                     "backoff_base_s": 0.0}},
                   reward={"judge": {"provider": "openai", "sample_share": 1.0,
                                     "openai": {**openai_cfg, "model": "judge-model", "max_retries": 2}}})


@pytest.mark.slow
def test_pipeline_run_leaks_no_key(project, fake_openai, rag_server, env_dirs, tmp_path):
    _configure(project, fake_openai.url, rag_server)
    queries = [json.loads(l) for l in (project.root / f"data/demo/{TENANT}.queries.jsonl").read_text().splitlines()]
    marker = queries[5]["query"]
    # Every prompt's first request: HTTP 500 quoting the Authorization header (retried); one query: 400
    # quoting it (recorded as a failed row with its reason). Judge prompts get a valid verdict.
    fake_openai.script(echo_auth=True, fail_first={"status": 500, "n": 1}, fail_if_contains={marker: 400},
                       replies={"<data>": '{"score": 4, "reason": "fine"}'})
    env = {**os.environ, **env_dirs, KEY_ENV: SENTINEL, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    outputs: dict[str, str] = {}

    exe = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile",
                           str(project.config_path), "--cores", "2", "--printshellcmds", *SNAKEMAKE_TARGETS],
                          capture_output=True, text=True, env=env, timeout=900)
    outputs["snakemake stdout"], outputs["snakemake stderr"] = proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr[-4000:]

    proc = subprocess.run([sys.executable, "-c", REWARD_PASS], cwd=project.root, capture_output=True, text=True,
                          env=env, timeout=600)
    outputs["reward pass stderr"], outputs["reward pass stdout"] = proc.stderr, proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]

    # The run really went through every keyed path: echoed errors, the failed row, judge verdicts.
    teacher = project.read_jsonl(PATHS["teacher"])
    failed = [r for r in teacher if r["status"] == "error"]
    assert failed and all("[REDACTED]" in r["reason"] for r in failed), failed
    statuses = [r["status"] for r in fake_openai.requests()]
    assert statuses.count(500) >= len(teacher) and 400 in statuses
    reward = json.loads((project.root / f"results/{TENANT}/reward_pass.json").read_text())
    assert reward["stats"]["judge_calls"] > 0 and reward["stats"]["judge_sampled"] == 36
    assert any(r["judge_sampled"] for r in reward["rewards"])
    assert list((project.root / "cache/reward/judge").rglob("*.json"))
    assert list((project.root / "cache/teacher").rglob("*.json"))

    found = leaks([project.root, Path(env_dirs["HOME"]), Path(env_dirs["TMPDIR"])], outputs)
    assert not found, f"the API key leaked into: {found}"


@pytest.mark.slow
def test_config_and_errors_never_print_the_key(project, fake_openai, tmp_path):
    env = {KEY_ENV: SENTINEL}
    project.keep_queries(TENANT, 5)
    project.stage("build-excel")
    project.stage("ingest")
    project.update(teacher={"provider": "openai", "openai": {"base_url": fake_openai.url, "model": "m",
                                                             "api_key_env": KEY_ENV, "max_retries": 0}})
    printed: dict[str, str] = {}

    proc = project.qrewrite("config", "--config", "config.yaml", env=env)
    printed["qrewrite config"] = proc.stdout + proc.stderr
    assert KEY_ENV in proc.stdout  # the variable's name is shown, its value is not

    # The service rejects the key and quotes it back: the stage stops, saying what to check.
    fake_openai.script(echo_auth=True, fail_first={"status": 401, "n": 100})
    proc = project.qrewrite("-v", *_teach_args(), env=env, check=False)
    printed["teach, HTTP 401"] = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "the API key was rejected" in proc.stderr

    # Other statuses quoting the key: recorded failures, redacted; all failing means the stage fails.
    marker = project.read_jsonl("results/fivedoctors/queries.jsonl")[0]["query"]
    fake_openai.script(echo_auth=True, fail_if_contains={marker: 400})
    proc = project.qrewrite("-v", *_teach_args(), env=env, check=False)
    printed["teach, HTTP 400 for one row"] = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "[REDACTED]" in (project.root / "t.jsonl").read_text()
    (project.root / "t.jsonl").unlink()
    shutil.rmtree(project.root / "cache" / "teacher")  # the answered rows would be usable cache hits
    fake_openai.script(echo_auth=True, fail_first={"status": 400, "n": 100})
    proc = project.qrewrite("-v", *_teach_args(), env=env, check=False)
    printed["teach, HTTP 400"] = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "[REDACTED]" in proc.stderr and "refused all" in proc.stderr
    assert not (project.root / "t.jsonl").exists()
    fake_openai.script(echo_auth=True, fail_first={"status": 503, "n": 100})
    proc = project.qrewrite("-v", *_teach_args(), env=env, check=False)
    printed["teach, HTTP 503"] = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "[REDACTED]" in proc.stderr and "failed every call" in proc.stderr

    # The key pasted into config where the variable's *name* belongs: refused without repeating it.
    cfg = project.config
    cfg["teacher"]["openai"]["api_key_env"] = SENTINEL
    project.set_config(cfg)
    proc = project.qrewrite(*_teach_args(), env=env, check=False)
    printed["teach, key in config"] = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "must be the NAME of an environment variable" in proc.stderr

    found = _leaks_in(printed, project.root)
    assert not found, f"the API key was printed or written: {found}"


def _teach_args() -> list[str]:
    return ["teacher", "--config", "config.yaml", "--tenant", TENANT, "--queries", PATHS["queries"], "--out", "t.jsonl",
            "--stats", "s.json", "--no-progress"]


def _leaks_in(printed: dict[str, str], root: Path) -> list[str]:
    forms = needles(SENTINEL)
    found = [f"{name} ({form})" for name, text in printed.items() for form, b in forms.items() if b in text.encode()]
    for f in root.rglob("*"):
        if f.is_file() and f.name != "config.yaml":  # config.yaml holds the pasted key: the user put it there
            found += [f"{f} ({form})" for form, b in forms.items() if b in f.read_bytes()]
    return found


# ---- a key pasted where the variable's NAME belongs: refused by every config load, never quoted ---------------------

PASTED = "sk-proj-AbC9xQ2mN7pL4tR8vW1yZ3kJ6hG5fD0sQ"


def _quoted(text: str) -> list[str]:
    """The forms of PASTED found in `text` (as `needles` searches for the sentinel)."""
    forms = {"raw": PASTED, "head": PASTED[:16], "tail": PASTED[-16:]}
    return [form for form, s in forms.items() if s in text]


def test_a_pasted_key_is_refused_by_qrewrite_config_a_stage_and_snakemake_without_quoting_it(project):
    """teacher.openai.api_key_env holding the key itself: `qrewrite config`, a stage's config load and Snakemake
    (before snakemake.utils.validate, whose messages quote the value) all stop with exit 2 / an error naming the
    setting and saying to export the key in a variable and put its name there, and print nothing of the key."""
    cfg = project.config
    cfg["teacher"]["openai"]["api_key_env"] = PASTED
    project.set_config(cfg)
    setting = "config key teacher.openai.api_key_env must be the NAME of an environment variable"

    proc = project.qrewrite("config", "--config", "config.yaml", check=False)
    assert proc.returncode == 2, proc.stderr
    assert setting in proc.stderr and "export the key in a variable" in proc.stderr \
        and "put the variable's name there" in proc.stderr, proc.stderr
    assert proc.stdout == "" and not _quoted(proc.stdout + proc.stderr), proc.stderr

    project.stage("build-excel", check=False)
    proc = project.stage("ingest", check=False)  # every stage loads the config the same way (cli_args.load)
    assert proc.returncode == 2 and setting in proc.stderr, proc.stderr
    assert not _quoted(proc.stdout + proc.stderr), proc.stderr

    exe = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(exe), "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--cores", "1", "-n"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    out = proc.stdout + proc.stderr  # Snakemake prints a Snakefile's error on stdout
    assert proc.returncode != 0 and setting in out, out[-3000:]
    assert not _quoted(out), out[-3000:]


def test_qrewrite_config_masks_the_value_of_a_secret_environment_variable(project):
    """What `qrewrite config` prints is redacted: a secret env var's value (here also typed into a prompt, which no
    pattern can tell from text) is printed as [REDACTED]; variable names stay."""
    secret = "内部口令-Zq7Xw3Rt"
    project.update_tenant("fivedoctors", system_prompt=f"改写查询。{secret}")
    proc = project.qrewrite("config", "--config", "config.yaml", env={"QR_DUMP_TOKEN": secret})
    assert secret not in proc.stdout and "改写查询。[REDACTED]" in proc.stdout
    assert "api_key_env: OPENAI_API_KEY" in proc.stdout
