"""Lineage: what lineage.json records, `qrewrite lineage verify` failing on any changed upstream byte, the tree
and sample trace of `qrewrite lineage show`, no secrets, and the upstream map (from the stage table) matching the Snakemake jobs.

The model folders here are small stand-in files (TEST FAKES: lineage only hashes bytes); the data artifacts
are real, made by the data-half commands. Real trained models are verified in tests/test_pipeline_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, Project
from qrewrite.config import load_config
from qrewrite.io_utils import sha256_file
from qrewrite.workflow.record import write_lineage
from qrewrite.lineage.verify import verify_lineage
from qrewrite.paths import BASE_MODEL, artifact_paths, tenant_paths
from qrewrite.workflow.stages import upstream

TENANT = "fivedoctors"
PATHS = tenant_paths(TENANT)


def fake_model(path: Path, files: dict[str, bytes]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(blob)


def make_chain(project: Project, slurm: str | None = None) -> dict[str, Path]:
    """sft → merge_sft → rl lineage over the real data artifacts, written the way the training rules do."""
    root = project.root
    cfg = load_config(root / "config.yaml")
    fake_model(root / BASE_MODEL, {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\x00base" * 64})
    fake_model(root / PATHS["sft_model"], {"adapter_config.json": b"{}", "adapter_model.safetensors": b"\x01lora" * 32})
    fake_model(root / PATHS["sft_merged"], {"config.json": b"{}", "model.safetensors": b"\x02merged" * 64})
    fake_model(root / PATHS["rl_model"], {"config.json": b"{}", "model.safetensors": b"\x03rl" * 64,
                                      "sub/tokenizer.json": b"{}"})
    old = Path.cwd()
    os.chdir(root)
    env_before = os.environ.get("SLURM_JOB_ID")
    try:
        if slurm:
            os.environ["SLURM_JOB_ID"] = slurm
        t0 = time.time()
        out = {
            "sft": write_lineage(PATHS["sft_model"], rule="sft", tenant=TENANT, config=cfg, env="swift", started=t0 - 60,
                                 ended=t0, inputs={"base": BASE_MODEL, "train": PATHS["sft_train"], "val": PATHS["sft_val"],
                                                   "data_card": PATHS["data_card_json"]},
                                 params={"learning_rate": 2e-4, "max_steps": 2}, usage={"gpu_s": 1.5}),
            "merge": write_lineage(PATHS["sft_merged"], rule="merge_sft", tenant=TENANT, config=cfg, env="swift",
                                   started=t0, ended=t0 + 5, inputs={"base": BASE_MODEL, "adapter": PATHS["sft_model"]},
                                   params={}),
            "rl": write_lineage(PATHS["rl_model"], rule="rl", tenant=TENANT, config=cfg, env="swift", started=t0 + 5,
                                ended=t0 + 65, inputs={"model": PATHS["sft_merged"], "train": PATHS["rl_train"],
                                                       "val": PATHS["rl_val"], "train_swift": PATHS["rl_train_swift"],
                                                       "kb": cfg["tenants"][0]["kb"]["path"]},
                                params={"backend": "swift-grpo"},
                                usage={"rag_calls": 12, "judge_calls": 3, "judge_cost_usd": 0.0}),
        }
    finally:
        os.chdir(old)
        if env_before is None:
            os.environ.pop("SLURM_JOB_ID", None)
        else:
            os.environ["SLURM_JOB_ID"] = env_before
    return out


def data_half(root: Path, n_queries: int) -> Project:
    """A project with tenant T alone, its first `n_queries` demo rows run through the data stages."""
    project = Project(root)
    cfg = project.config
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == TENANT]
    project.set_config(cfg)
    project.keep_queries(TENANT, n_queries)
    project.update_tenant(TENANT, student="always")  # a few rows, under the gate's floor: lineage, not quality
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check", "summarize", "data-card",
                  "training-gate", "sft-targets"):
        project.stage(stage)
    return project


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    project = data_half(tmp_path_factory.mktemp("lineage") / "proj", 50)
    project.qrewrite("rl-data", "--config", "config.yaml", "--tenant", TENANT, "--train", PATHS["train"], "--val", PATHS["val"],
                     "--queries", PATHS["queries"], "--out-dir", PATHS["rl_dir"])
    return project, make_chain(project, slurm="4242")


def lineage(project: Project, key: str) -> dict:
    return json.loads((project.root / tenant_paths(TENANT)[key] / "lineage.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_lineage_records_the_whole_chain_back_to_the_raw_excel(chain):
    project, _ = chain
    doc = lineage(project, "rl_model")
    up = {e["key"]: e for e in doc["upstream"]}
    # every artifact back to the raw Excel (and the demo source it is built from), with its sha256
    for key in ("demo_source", "raw_excel", "kb", "queries", "teacher", "validated", "train", "val", "base_model",
                "sft_model", "sft_merged", "rl_train", "rl_val", "rl_train_swift"):
        assert key in up, key
    assert up["raw_excel"]["path"] == "data/raw/fivedoctors.xlsx"
    assert up["raw_excel"]["sha256"] == sha256_file(project.root / "data/raw/fivedoctors.xlsx")
    assert up["raw_excel"]["made_by"] == {"rule": "build_excel", "inputs": ["demo_source"]}
    assert up["queries"]["made_by"] == {"rule": "ingest", "inputs": ["raw_excel", "kb"]}
    assert up["sft_merged"]["made_by"]["rule"] == "merge_sft" and up["sft_merged"]["type"] == "dir"
    order = [e["key"] for e in doc["upstream"]]
    assert order.index("raw_excel") < order.index("queries") < order.index("train") < order.index("sft_model")
    # the direct inputs, the chained lineage of the input model, the model's own files
    assert doc["inputs"]["model"]["lineage"] == "models/fivedoctors/sft-merged/lineage.json"
    assert doc["chained"] == [{"path": "models/fivedoctors/sft-merged/lineage.json",
                               "sha256": sha256_file(project.root / "models/fivedoctors/sft-merged/lineage.json")}]
    assert set(doc["model"]["files"]) == {"config.json", "model.safetensors", "sub/tokenizer.json"}
    assert doc["model"]["rule"] == "rl" and doc["params"] == {"backend": "swift-grpo"}
    # code version, environment, providers, usage, run
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert doc["code"]["git_commit"] == head and isinstance(doc["code"]["dirty"], bool)
    env = doc["env"]
    assert env["name"] == "swift" and env["requirements"]["envs/swift.txt"] == sha256_file(REPO / "envs/swift.txt")
    assert env["requirements"]["envs/torch.txt"] == sha256_file(REPO / "envs/torch.txt")
    assert env["container_recipe"] == {f"containers/{n}.Containerfile": sha256_file(REPO / f"containers/{n}.Containerfile")
                                       for n in ("base", "swift")}
    assert env["container"] is None  # made on the host: no image (tests/test_container_images.py: in one)
    assert doc["providers"]["teacher"]["provider"] == "resolve" and doc["providers"]["teacher"]["model"] == "kb-entity-resolver"
    assert doc["providers"]["judge"] == {"provider": "rule", "model": "rules-v3", "base_url": None}
    assert doc["usage"]["rule"] == {"rag_calls": 12, "judge_calls": 3, "judge_cost_usd": 0.0}
    assert doc["usage"]["upstream"]["teacher"]["calls"] == 50 and doc["usage"]["upstream"]["teacher"]["cost_usd"] == 0
    assert doc["run"]["slurm_job_id"] == "4242" and doc["run"]["host"] and doc["run"]["duration_s"] == 60
    assert doc["run"]["started"] < doc["run"]["ended"]
    # row-level provenance of the training data
    s = doc["samples"]["train"]
    assert s["rows"] == len(project.read_jsonl(PATHS["train"])) and s["links"] == ["meta.query_id", "meta.raw_row",
                                                                              "meta.teacher_call_key"]


def _flip_one_byte(path: Path) -> tuple[Path, bytes]:
    target = path if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())[0]
    blob = target.read_bytes()
    target.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    return target, blob


@pytest.mark.slow
def test_verify_fails_naming_the_artifact_whenever_any_upstream_byte_changes(chain):
    project, _ = chain
    model = project.root / PATHS["rl_model"]
    assert verify_lineage(model) == []
    doc = lineage(project, "rl_model")
    targets = [e["path"] for e in doc["upstream"]] + [f"{PATHS['rl_model']}/{f}" for f in doc["model"]["files"]]
    # 29 upstream artifacts (the data half, its stats, the reward check and the judge labels it read, summary and
    # data card (its json, which SFT reads, and its page, which the training gate waits for), gold and red-team
    # sets, the training gate, the SFT targets, base and SFT models, RL files) + the model's 3 files
    assert len(set(targets)) == len(targets) == 32
    assert {PATHS["data_card"], PATHS["data_card_json"]} <= set(targets)
    assert {PATHS["sft_train"], PATHS["sft_val"], PATHS["gate"]} <= set(targets)
    assert {PATHS["data_card_json"], PATHS["summary"], PATHS["stats_split"], PATHS["reward_check"]} <= set(targets)
    for rel in targets:
        changed, blob = _flip_one_byte(project.root / rel)
        try:
            problems = verify_lineage(model)
            assert problems, f"changing a byte of {changed} went unnoticed"
            assert problems[0][0] == rel, (rel, problems[:3])
        finally:
            changed.write_bytes(blob)
    assert verify_lineage(model) == []


@pytest.mark.slow
def test_verify_cli_exit_code_and_message_and_chained_lineage(chain):
    project, _ = chain
    # Snakemake touches .snakemake_timestamp in directory outputs after the job, i.e. after lineage.json was
    # written: bookkeeping, not content
    for key in ("rl_model", "sft_merged", "sft_model"):
        (project.root / PATHS[key] / ".snakemake_timestamp").write_text("")
    (project.root / BASE_MODEL / ".snakemake_timestamp").write_text("")
    ok = project.qrewrite("lineage", "verify", PATHS["rl_model"])
    assert ok.stdout.startswith("OK models/fivedoctors/rl")
    # the sft adapter is two hops up; its own lineage (chained via sft-merged) notices a changed training file
    changed, blob = _flip_one_byte(project.root / PATHS["sft_model"] / "adapter_model.safetensors")
    try:
        bad = project.qrewrite("lineage", "verify", PATHS["rl_model"], check=False)
        assert bad.returncode == 2
        assert "models/fivedoctors/sft" in bad.stderr and "no longer matches" in bad.stderr
        bad = project.qrewrite("lineage", "verify", PATHS["sft_model"], check=False)
        assert bad.returncode == 2 and "models/fivedoctors/sft/adapter_model.safetensors" in bad.stderr
    finally:
        changed.write_bytes(blob)
    # from another working directory, by absolute path
    proc = subprocess.run([sys.executable, "-m", "qrewrite", "lineage", "verify", str(project.root / PATHS["rl_model"])],
                          cwd="/", capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    missing = project.qrewrite("lineage", "verify", "models/nope", check=False)
    assert missing.returncode == 2 and "no lineage.json" in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("named", ["containers/swift.sif", "docker://example.org/qrewrite-swift:1"])
def test_verify_reports_a_model_made_in_another_image_than_its_rule_names(chain, monkeypatch, named):
    """Apptainer names the SIF a job runs in ($APPTAINER_CONTAINER); lineage.json records its sha256, and verify
    compares it with the image the rule names now (config `containers.swift`: a path, or for a docker:// image
    the SIF Snakemake pulled it into). The SIF here is a TEST FAKE: a file of bytes, hashed as a real one is."""
    from qrewrite.lineage.container import running_image, snakemake_image_path

    project, _ = chain
    root = project.root
    cfg = load_config(root / "config.yaml")
    cfg["containers"]["swift"] = named
    sif = snakemake_image_path(named, root) if "://" in named else root / named
    sif.parent.mkdir(parents=True, exist_ok=True)
    sif.write_bytes(b"SIF image as built" * 100)
    model = "models/fivedoctors/sft-in-image"
    fake_model(root / model, {"adapter_config.json": b"{}", "adapter_model.safetensors": b"\x05lora" * 32})
    monkeypatch.chdir(root)
    monkeypatch.setenv("APPTAINER_CONTAINER", str(sif))
    running_image.cache_clear()
    try:
        write_lineage(model, rule="sft", tenant=TENANT, config=cfg, env="swift", started=0, ended=1,
                      inputs={"base": BASE_MODEL, "train": PATHS["train"], "val": PATHS["val"]}, params={})
    finally:
        running_image.cache_clear()
    digest = "sha256:" + sha256_file(sif)
    doc = json.loads((root / model / "lineage.json").read_text())
    assert doc["env"]["container"] == {"runtime": "apptainer", "image": str(sif), "digest": digest}
    assert verify_lineage(root / model) == []
    sif.write_bytes(b"SIF image rebuilt since")  # the rule's image is now another one
    problems = verify_lineage(root / model)
    assert problems == [(named, f"rule sft ran in image {digest[:19]}… (apptainer {sif}), but the image it names "
                                f"is sha256:{sha256_file(sif)[:12]}…")]
    sif.unlink()
    [(what, why)] = verify_lineage(root / model)
    assert what == named and f"rule sft ran in image {digest[:19]}…, which cannot be checked here" in why \
        and "not found" in why


@pytest.mark.slow
def test_show_prints_the_tree_and_traces_a_sample_to_its_excel_row_and_teacher_call(chain):
    project, _ = chain
    tree = project.qrewrite("lineage", "show", PATHS["rl_model"]).stdout
    for needle in ("models/fivedoctors/rl", "made by rule `rl`", "models/fivedoctors/sft-merged", "← merge_sft",
                   "data/raw/fivedoctors.xlsx", "← build_excel", "data/demo/fivedoctors.queries.jsonl",
                   "Slurm job 4242", "teacher: resolve/kb-entity-resolver"):
        assert needle in tree, needle
    sample = project.read_jsonl(PATHS["train"])[0]
    out = project.qrewrite("lineage", "show", PATHS["sft_model"], "--trace", "train:1").stdout
    meta = sample["meta"]
    assert meta["query_id"] in out and meta["teacher_call_key"] in out
    assert f"data/raw/fivedoctors.xlsx row {meta['raw_row']}" in out
    query = next(q for q in project.read_jsonl(PATHS["queries"]) if q["id"] == meta["query_id"])
    assert query["query"] in out
    assert project.qrewrite("lineage", "show", PATHS["sft_model"], "--trace", meta["query_id"]).stdout == out
    nope = project.qrewrite("lineage", "show", PATHS["sft_model"], "--trace", "q-nope", check=False)
    assert nope.returncode == 2 and "no training sample" in nope.stderr


@pytest.mark.slow
def test_verify_checks_every_samples_links(tmp_path):
    """A sample whose raw row disagrees with queries.jsonl fails verify even though every hash matches."""
    project = data_half(tmp_path / "proj", 30)
    train = project.root / PATHS["train"]
    rows = project.read_jsonl(PATHS["train"])
    rows[1]["meta"]["raw_row"] += 1000
    train.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    fake_model(project.root / BASE_MODEL, {"config.json": b"{}"})
    fake_model(project.root / PATHS["sft_model"], {"adapter_model.safetensors": b"x"})
    old = Path.cwd()
    os.chdir(project.root)
    try:
        write_lineage(PATHS["sft_model"], rule="sft", tenant=TENANT, config=load_config("config.yaml"), env="swift",
                      started=0, ended=1, inputs={"base": BASE_MODEL, "train": PATHS["train"], "val": PATHS["val"]}, params={})
    finally:
        os.chdir(old)
    problems = verify_lineage(project.root / PATHS["sft_model"])
    assert problems and problems[0][0] == f"{PATHS['train']} line 2 (query {rows[1]['meta']['query_id']})"
    assert "raw_row" in problems[0][1]


@pytest.mark.slow
def test_no_secret_is_ever_written(chain, monkeypatch, tmp_path):
    project, _ = chain
    secret = "sk-live-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.chdir(project.root)
    cfg = load_config("config.yaml")
    cfg["teacher"]["openai"]["api_key"] = secret            # a secret pasted into config by mistake
    cfg["rag"]["http"]["headers"] = {"Authorization": "Bearer abc.def"}
    path = write_lineage(PATHS["sft_model"], rule="sft", tenant=TENANT, config=cfg, env="swift", started=0, ended=1,
                         inputs={"base": BASE_MODEL, "train": PATHS["train"], "val": PATHS["val"]},
                         params={"hub_token": "hf_abcdefghijkl", "lr": 1e-4})
    text = path.read_text(encoding="utf-8")
    assert secret not in text and "Bearer abc.def" not in text and "hf_abcdefghijkl" not in text
    doc = json.loads(text)
    assert doc["config"]["teacher"]["openai"]["api_key_env"] == "OPENAI_API_KEY"  # the NAME is kept
    assert doc["params"] == {"hub_token": "<removed>", "lr": 1e-4}
    from qrewrite.errors import QrewriteError

    with pytest.raises(QrewriteError, match="secret environment variable"):
        write_lineage(PATHS["sft_model"], rule="sft", tenant=TENANT, config=load_config("config.yaml"), env="swift",
                      started=0, ended=1, inputs={"train": PATHS["train"]}, params={"note": f"key was {secret}"})
    make_chain(project, slurm="4242")  # restore the chain's sft lineage for the other tests


@pytest.mark.slow
def test_upstream_map_matches_the_snakemake_rules(project):
    """The upstream map lineage walks (derived from the stage table) names the same rule and inputs as every job
    Snakemake plans."""
    UPSTREAM = upstream()
    from qrewrite.workflow.stages import switched_off_keys
    from test_dvc import snakemake_jobs

    jobs = snakemake_jobs(project.root)
    cfg = load_config(project.config_path)
    witnessed = set()
    for (rule, key), job in jobs.items():
        tenant = next((t for t in cfg["tenants"] if key == t["name"]), None)
        if tenant is None and key:
            continue  # eval candidates: not model inputs
        paths = artifact_paths(tenant) if tenant else {"base_model": BASE_MODEL}
        by_path = {os.path.normpath(p): k for k, p in paths.items()}
        outs = [by_path[os.path.normpath(o)] for o in job["outs"] if os.path.normpath(o) in by_path]
        ins = {by_path.get(os.path.normpath(i), i) for i in job["deps"]}
        off = switched_off_keys(cfg)  # what a stage the config switches off makes: no job's input, no job's output
        for out in outs:
            if out not in UPSTREAM:
                continue
            assert UPSTREAM[out][0] == rule, (out, rule)
            assert set(UPSTREAM[out][1]) - off == ins, (out, rule, ins)
            witnessed.add(out)
    want = set(UPSTREAM) - switched_off_keys(cfg)
    assert witnessed == want, f"UPSTREAM entries no rule makes: {want - witnessed}"


def test_secret_stripping_keeps_token_counts_and_env_var_names():
    from qrewrite.secret import strip_secrets
    doc = {"teacher": {"max_tokens": 256, "api_key_env": "OPENAI_API_KEY", "api_key": "sk-x", "hf_token": "hf_x"},
           "usage": {"prompt_tokens": 10, "completion_tokens": 5}, "tokenizer": "chatml", "token": "t",
           "nested": [{"authorization": "Bearer y", "max_completion_tokens": 48}]}
    out = strip_secrets(doc)
    assert out["teacher"] == {"max_tokens": 256, "api_key_env": "OPENAI_API_KEY", "api_key": "<removed>",
                              "hf_token": "<removed>"}
    assert out["usage"] == {"prompt_tokens": 10, "completion_tokens": 5}
    assert out["tokenizer"] == "chatml" and out["token"] == "<removed>"
    assert out["nested"] == [{"authorization": "<removed>", "max_completion_tokens": 48}]
