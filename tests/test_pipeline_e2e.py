"""The whole pipeline end to end, as `make run` runs it, once, on a tiny config (both tenants, 60 queries each,
2 SFT steps, 1 GRPO step, eval on 3 test queries with 16 new tokens): real Snakemake, real ms-swift on CPU
(`swift sft` LoRA → `swift export --merge_lora` → `swift rlhf --rlhf_type grpo` with the reward plugin → merge),
eval of every candidate, the report, lineage, Snakemake's --report and DVC.

One run serves every test here (they are ordered: the DVC test, which changes the project, is last), so the
expensive part is paid once. The run also carries an API key: the RL judge, the eval judge and an API eval
candidate all call the test OpenAI server (tests/fake_openai_server.py, a TEST FAKE) with a sentinel key set
only in the environment, and everything the run wrote or printed is then searched for it.
"""

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

from conftest import (REPO, TESTS, TINY_BASE, FakeOpenAI, Project, doc_section, fenced, free_port, run_documented,
                      start_server, stop, user_env)
from qrewrite.paths import BASE_MODEL, REPORT_HTML, eval_paths, tenant_paths
from test_report import check_self_contained, png_size, screenshot
from test_reward_frameworks import train_python
from test_secrets import KEY_ENV, SENTINEL, leaks

TENANTS = ("fivedoctors", "chengla")

TINY = {
    # the tests' tiny model: SmolLM2-135M, shipped by a pinned wheel, cut to 4 of its 30 blocks (conftest.TINY_BASE;
    # the embedded default, Qwen2.5-0.5B, is 4x bigger and measured by `make run`, not by `make test`)
    "base_model": TINY_BASE,
    # one thread a job and the smallest batches that keep every path: `make test` runs two test files at a time
    # (Makefile), and a 2-thread torch job beside another process loses more than it gains on 2 cores
    # one validation-loss evaluation, after the last step (schedule() rounds 2 / 18 evaluations up to 1): each generates
    # every validation row (20) at one thread, more than the 2 training steps cost, and the runs of this config are several in `make test`
    "train": {"device": "cpu", "threads": 1, "sft": {"max_steps": 2, "per_device_train_batch_size": 1,
                                                      "per_device_eval_batch_size": 8, "gradient_accumulation_steps": 1,
                                                      "max_length": 512, "evals_per_epoch": 1,
                                                      "logging_steps": 1, "learning_rate": 2.0e-4}},
    # the release with one decoding (plain greedy): the decoding levers, copy_bias among them, are
    # tests/test_release.py's; here each generation of the validation rows costs minutes of the shared run
    "release": {"candidates": ["query_history", "sft", "rl"], "decoding": [{}], "margin_rows": 0.5},
    "rl": {"backend": "swift-grpo", "swift_grpo": {"max_steps": 1, "per_device_train_batch_size": 2,
                                                   "num_generations": 2, "max_completion_length": 16,
                                                   "max_length": 512, "save_steps": 1}},
    # the tests' trimmed tenants train on a few rows: the gate's floor is config.yaml's concern (tests of the gate:
    # tests/test_own_tenant.py)
    "gate": {"min_train_rows": 1},
}
JUDGE_REPLY = '{"score": 4, "reason": "complete and specific"}'

TB_TAGS = """
import json, sys
from tensorboard.backend.event_processing import event_accumulator
out = {}
for d in sys.argv[1:]:
    ea = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    out[d] = {t: [e.value for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
print(json.dumps(out))
"""


class Run:
    """The project after the run, the environment it ran in, and what it printed."""

    def __init__(self, project: Project, env: dict, dirs: dict, fake: FakeOpenAI):
        self.project, self.env, self.dirs, self.fake = project, env, dirs, fake
        self.root = project.root
        self.printed: dict[str, str] = {}

    def tool(self, *cmd: str, timeout: float = 3600, name: str | None = None) -> str:
        proc = subprocess.run(list(cmd), cwd=self.root, capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        self.printed[name or " ".join(cmd[:3])] = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        return proc.stdout + proc.stderr

    def snakemake(self, *args: str, name: str | None = None) -> str:
        return self.tool(str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile"), "-d",
                         str(self.root), "--configfile", str(self.project.config_path), "--cores", "2", *args,
                         name=name)

    def qrewrite(self, *args: str, check: bool = True):
        proc = subprocess.run([sys.executable, "-m", "qrewrite", *args], cwd=self.root, capture_output=True,
                              text=True, env=self.env, timeout=600)
        self.printed["qrewrite " + " ".join(args[:2])] = proc.stdout + proc.stderr
        if check:
            assert proc.returncode == 0, proc.stderr[-3000:]
        return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    train_python("swift")  # fails (not skips) in CI when the env is missing
    base = tmp_path_factory.mktemp("e2e")
    state = base / "fake_openai"
    state.mkdir()
    port = free_port()
    server = start_server([sys.executable, str(TESTS / "fake_openai_server.py"), "--port", str(port), "--state",
                           str(state)], f"http://127.0.0.1:{port}/health", base, base / "fake_openai.log")
    fake = FakeOpenAI(f"http://127.0.0.1:{port}/v1", state)
    fake.script(replies={"<data>": JUDGE_REPLY})  # judge prompts get a verdict; others the "改写：" echo

    project = Project(base / "proj")
    cfg = project.config
    cfg.update(TINY)
    api = {"base_url": fake.url, "api_key_env": KEY_ENV, "timeout_s": 30}
    # The test server's judge answers 4 to everything: AUC 0.5 on the derived labels, which `qrewrite rl` would
    # refuse (tests/test_signals.py shows it does). Here the point is the API judge's path through RL, so the
    # floor is lowered, as a user who accepts such a judge would.
    cfg["reward"] = {"judge": {"provider": "openai", "sample_share": 1.0,
                               "openai": {**api, "model": "judge-model", "max_retries": 2}},
                     "check": {"judge_min_auc": 0.0}}
    # the fake judge model has a list price (the distilled-judge test estimates the API judge's cost from it); set
    # here, not later: teacher.prices is a parameter of the teacher rule, so changing it reruns everything
    cfg.setdefault("teacher", {}).setdefault("prices", {})["judge-model"] = {"input_per_1m": 1.0, "output_per_1m": 4.0}
    cfg["eval"].update({"max_rows": 3, "generation": {"batch_size": 8, "max_new_tokens": 16, "latency_sample": 1}})
    # the zero-shot base model too (config.yaml leaves it out to save CPU time), with the schema's comparisons
    names = [c["name"] for c in cfg["eval"]["candidates"]]
    if "base" not in names:
        cfg["eval"]["candidates"].insert(names.index("sft"), {"name": "base", "kind": "model", "artifact": "base_model"})
    cfg["eval"].pop("compare", None)
    cfg["eval"]["candidates"].append({"name": "api", "kind": "openai", "openai": {**api, "model": "api-model"}})
    project.set_config(cfg)
    for t in TENANTS:
        project.keep_queries(t, 60)
        # gold set and red team rows are generated by each local model besides the 3 test rows: a few of each
        # (every attack type) keep their paths without 40 more generations per model (tests/test_red_team_gold.py
        # scores the full sets)
        project.keep_checks(t, gold=4, per_attack=1)

    # A private HOME and TMPDIR, so files written outside the project are searched for the key too.
    dirs = {"HOME": base / "home", "TMPDIR": base / "tmpdir"}
    for d in dirs.values():
        d.mkdir()
    env = {**os.environ, "HOME": str(dirs["HOME"]), "TMPDIR": str(dirs["TMPDIR"]),
           "XDG_CACHE_HOME": str(dirs["HOME"] / ".cache"), KEY_ENV: SENTINEL, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = Run(project, env, dirs, fake)
    try:
        r.snakemake("--printshellcmds", name="snakemake (rule all)")
        yield r
    finally:
        stop(server)


# ------------------------------------------------------------------------------------------ training

@pytest.mark.slow
def test_models_are_made_for_both_tenants(run):
    root = run.root
    base = root / BASE_MODEL
    assert (base / "config.json").is_file() and (base / "model.safetensors").is_file()
    assert "im_start" in json.loads((base / "tokenizer_config.json").read_text()).get("chat_template", "") or \
        (base / "chat_template.jinja").is_file()
    # cut to TINY_BASE's blocks by the base_model stage, and its lineage says so
    assert json.loads((base / "config.json").read_text())["num_hidden_layers"] == TINY_BASE["layers"]
    assert json.loads((base / "lineage.json").read_text())["params"]["layers"] == TINY_BASE["layers"]
    for t in TENANTS:
        p = tenant_paths(t)
        assert (root / p["sft_model"] / "adapter_config.json").is_file()
        assert (root / p["sft_model"] / "adapter_model.safetensors").is_file()
        for key in ("sft_merged", "rl_model"):
            m = root / p[key]
            assert (m / "config.json").is_file() and list(m.glob("*.safetensors")), key
        sft = json.loads((root / p["stats_sft"]).read_text())
        assert sft["best_eval_loss"] is not None and sft["steps"] == 2
        assert sft["best_checkpoint"] in {"checkpoint-1", "checkpoint-2"}
        assert sft["hparams"]["lora_rank"] == 16 and sft["hparams"]["lora_alpha"] == 32  # the design's (schema)
        rl = json.loads((root / p["stats_rl"]).read_text())
        assert rl["backend"] == "swift-grpo" and rl["reward"]["rollouts_scored"] == 2
        assert -1.0 <= rl["reward"]["last"]["reward_mean"] <= 1.0
        assert rl["reward"]["rag_calls"] + rl["reward"]["rag_cache_hit_rate"] > 0
        assert rl["reward"]["judge_calls"] > 0  # the judge really was the API, with the key
        # the rl stage compared the RL model with its SFT parent on the validation prompts (training/rl/guard.py)
        vs = rl["vs_sft"]
        assert vs["n"] > 0 and vs["basis"] in ("hit_at_1", "reward") and isinstance(vs["worse_beyond_noise"], bool)
        assert vs["means"]["sft"]["reward"] is not None and 0 < vs[vs["basis"]]["n"] <= vs["n"]
        # both models' degenerate rewrites counted, of the validation prompts (what the tenant gets: the release)
        assert "ship" not in vs and set(vs["degenerate"]) == {"sft", "rl"}
        assert all(0 <= d["n"] <= vs["n"] for d in vs["degenerate"].values())
        # the release: chosen on validation among query + history, SFT and RL, by the rule
        from qrewrite.release.select import choose

        rel = json.loads((root / p["release"] / "release.json").read_text())
        assert [c["name"] for c in rel["candidates"]] == ["query_history", "sft", "rl"]
        # both students' rewrites of the validation rows come from the rl stage's parent check, which generated
        # them with the same weights, prompts and decoding (qrewrite.eval.reuse): not generated twice
        assert {c["name"]: c.get("reused_from") for c in rel["candidates"]} == {
            "query_history": None, "sft": p["rl_val_rewrites"], "rl": p["rl_val_rewrites"]}
        assert rel["released"]["name"] == choose(rel["candidates"], rel["decision"]["margin_rows"])["name"]
        assert rel["n_with_gold"] == len([r for r in run.project.read_jsonl(p["val"]) if r["meta"]["gold_doc_ids"]])
        assert (rel["released"]["kind"] == "model") == (root / p["release"] / "config.json").is_file()
        assert sft["schedule"]["planned_steps"] == 2 and sft["stopped"] in ("epochs done", "early stop")
    assert not [x for x in (root / "models").rglob(".*") if x.name.endswith(".tmp")]  # no temp folders left


@pytest.mark.slow
def test_tensorboard_logs_hold_losses_and_reward_components(run):
    py = train_python("swift")
    dirs = [str(run.root / tenant_paths(t)[k]) for t in TENANTS for k in ("tb_sft", "tb_rl")]
    proc = subprocess.run([str(py), "-c", TB_TAGS, *dirs], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = json.loads(proc.stdout.strip().splitlines()[-1])
    for sft_dir, rl_dir in zip(dirs[::2], dirs[1::2]):
        sft, rl = tags[sft_dir], tags[rl_dir]
        assert "train/loss" in sft and "eval/loss" in sft, sorted(sft)
        for tag in ("reward_mean", "judge_term", "retrieval_term", "win_term", "win_rate", "student_top1",
                    "teacher_top1", "rag_calls", "judge_calls", "rag_cache_hit_rate", "judge_cache_hit_rate"):
            assert f"qrewrite/{tag}" in rl, tag
        assert "train/loss" in rl and "train/reward" in rl, sorted(rl)
        # the monitor's mean reward is the mean ms-swift logged for the same step
        assert rl["qrewrite/reward_mean"][0] == pytest.approx(rl["train/reward"][0], abs=1e-4)


@pytest.mark.slow
def test_rerun_is_a_no_op(run):
    out = run.snakemake("-n", name="snakemake -n")
    assert "Nothing to be done" in out


# ------------------------------------------------------------------------------------------ eval + report

@pytest.mark.slow
def test_pipeline_evaluates_every_candidate_for_both_tenants(run):
    root = run.root
    for t in TENANTS:
        doc = json.loads((root / eval_paths(t)["eval_json"]).read_text())
        assert list(doc["candidates"]) == ["raw", "query_history", "teacher", "base", "sft", "rl", "release", "api"]
        assert doc["n_queries"] == 3 and "random tie-breaking" in doc["tie_rule"]
        assert set(doc["headline"]) == {"teacher", "release", "sft", "rl"}
        rel = json.loads((root / tenant_paths(t)["release"] / "release.json").read_text())
        assert doc["candidates"]["release"]["released"] == rel["released"]["name"]
        assert doc["candidates"]["release"]["kind"] == "release"
        assert (doc["judge"]["provider"], doc["judge"]["model"]) == ("openai", "judge-model")
        for name in ("base", "sft", "rl"):
            c = doc["candidates"][name]
            assert c["kind"] == "model" and c["latency_s"]["p50"] > 0 and c["cost_per_1k_usd"] > 0
            assert c["generation"]["max_new_tokens"] == 16
            assert c["judge"]["mean"] == 4  # every query judged by the API judge (JUDGE_REPLY)
            # degenerate rewrites counted per model; the fallback's figures only when one was replaced
            d = c["degenerate"]
            assert 0 <= d["n"] <= 3 and sum(d["by_reason"].values()) == d["n"] and ("with_fallback" in c) == (d["n"] > 0)
        api = doc["candidates"]["api"]
        assert api["kind"] == "openai" and api["latency_s"]["p50"] > 0
        assert set(doc["comparisons"]) == {"release_vs_query_history", "release_vs_teacher", "rl_vs_sft",
                                           "sft_vs_base", "sft_vs_raw", "rl_vs_teacher",
                                           "sft_vs_teacher", "sft_vs_query_history", "rl_vs_query_history",
                                           "teacher_vs_raw"}
        assert doc["comparisons"]["rl_vs_sft"]["hit_at_1"]["n"] == 3
    html = (root / REPORT_HTML).read_text(encoding="utf-8")
    check_self_contained(html)
    for t in TENANTS:
        assert f"<section id='{t}'>" in html and f"logs/tensorboard/{t}/rl" in html
        assert "no TensorBoard logs" not in html and "no lineage.json" not in html
    # the report leads with what each tenant gets
    assert html.index("What each tenant gets: the release") < html.index("Headline: teacher vs release")
    png = root / "reports/index.png"
    if not screenshot(root / REPORT_HTML, png):
        pytest.skip("NOT CHECKED: no chromium to screenshot the report (apt-get install chromium fonts-noto-cjk)")
    w, h = png_size(png)
    assert (w, h) == (1400, 3000) and png.stat().st_size > 100_000


@pytest.mark.slow
def test_every_model_verifies_and_fails_when_an_upstream_byte_changes(run):
    root = run.root
    models = [BASE_MODEL] if (root / BASE_MODEL / "lineage.json").exists() else []
    models += [tenant_paths(t)[k] for t in TENANTS for k in ("sft_model", "sft_merged", "rl_model", "release")]
    for m in models:
        out = run.qrewrite("lineage", "verify", m).stdout
        assert out.startswith(f"OK {m}"), out
    raw = root / "data/raw/chengla.xlsx"
    blob = raw.read_bytes()
    raw.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    try:
        for t in TENANTS:
            proc = run.qrewrite("lineage", "verify", tenant_paths(t)["rl_model"], check=False)
            if t == "chengla":
                assert proc.returncode == 2 and "data/raw/chengla.xlsx no longer matches" in proc.stderr
            else:
                assert proc.returncode == 0, proc.stderr
    finally:
        raw.write_bytes(blob)
    doc = json.loads((root / tenant_paths("chengla")["rl_model"] / "lineage.json").read_text())
    assert doc["model"]["rule"] == "rl" and doc["run"]["host"] and doc["code"]["git_commit"]
    assert doc["samples"] == {} or "train" in doc["samples"] or doc["chained"]
    # the judge is named, its key is not; token limits are kept (they are counts, not secrets)
    judge = doc["config"]["reward"]["judge"]["openai"]
    assert judge["model"] == "judge-model" and judge["api_key_env"] == KEY_ENV and judge["max_tokens"] == 200


@pytest.mark.slow
def test_snakemake_report_includes_the_eval_outputs(run, tmp_path):
    out = tmp_path / "smk-report.html"
    run.snakemake("--report", str(out), name="snakemake --report")
    html = out.read_text(encoding="utf-8", errors="replace")
    for needle in ("eval.json", "examples.jsonl", "plots.json", "index.html", "Evaluation"):
        assert needle in html, needle


# ------------------------------------------------------------------------------------------ the distilled judge

# LoRA on the top 2 of the tiny base's 4 blocks (the judge's default, 12, is for the full models)
JUDGE_TINY = {"student_samples": 1, "max_questions": 6, "eval_max_items": 3,
              "sft": {"max_steps": 2, "evals_per_epoch": 1, "max_length": 512, "per_device_train_batch_size": 1,
                      "lora_layers": 2},
              "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2,
                       "gradient_accumulation_steps": 1, "max_completion_length": 24, "max_length": 512,
                       "save_steps": 1, "lora_layers": 2}}


@pytest.mark.slow
def test_distilled_judge_chain_and_rl_judged_by_it(run):
    """`snakemake judge` for one tenant: items, SFT, GRPO, each model with lineage, judge.json with every judge
    on every set; then `qrewrite rl` with reward.judge.provider: model, the distilled judge judging the rollouts."""
    import yaml

    cfg = yaml.safe_load(run.project.config_path.read_text(encoding="utf-8"))
    cfg["judge"] = JUDGE_TINY  # a parameter of the judge rules only: nothing of `all` reruns
    # short judgements (a 2-step judge writes no valid verdict anyway): reward.judge.model is read by judge-eval
    # and, with the API judge judging `all`, by no stage of it (stages.param_value)
    cfg["reward"]["judge"]["model"] = {**(cfg["reward"]["judge"].get("model") or {}), "max_new_tokens": 16}
    run.project.config_path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    run.snakemake("judge", "--config", "only=fivedoctors", name="snakemake judge")
    p, root = tenant_paths("fivedoctors"), run.root
    stats = json.loads((root / p["stats_judge_data"]).read_text())
    assert stats["items"] > 0 and set(stats["by_split"]) <= {"train", "heldout"} and stats["rationale_source"] == "llm"
    items = [json.loads(ln) for ln in (root / p["judge_items"]).read_text(encoding="utf-8").splitlines()]
    assert {r["kind"] for r in items} >= {"teacher", "raw", "other_row"} and all(r["reason"] for r in items)
    for key in ("judge_sft_merged", "judge_model"):
        out = run.qrewrite("lineage", "verify", p[key]).stdout
        assert out.startswith(f"OK {p[key]}"), out
    doc = json.loads((root / eval_paths("fivedoctors")["judge_json"]).read_text())
    assert set(doc["judges"]) == {"base", "sft", "grpo", "rule", "api"}
    for name, r in doc["judges"].items():
        assert r["heldout"]["format_valid"] is not None and r["seconds_per_judgement"] > 0, name
        assert 0 <= r["heldout"]["accuracy"]["value"] <= 1 and r["cost_per_1k_usd"] >= 0, name
    # 1,000 judgements of prompts of at least 100 tokens at $1 per 1M input tokens, + 40 reply tokens at $4
    assert doc["judges"]["api"]["cost_per_1k_usd"] > (100 * 1.0 + 40 * 4.0) / 1e6 * 1000
    assert doc["api_judge_price"]["usd_per_1k"] == doc["judges"]["api"]["cost_per_1k_usd"]
    assert doc["sets"]["heldout"]["n"] <= 3
    # RL with the distilled judge as the reward's judge (every rollout judged), shown the key terms from the KB and
    # blended with the rule judge (reward.judge.model.rule_weight)
    rj = cfg["reward"]["judge"]
    cfg["reward"] = {**cfg["reward"], "judge": {**rj, "provider": "model", "sample_share": 1.0,
                                                "model": {**(rj.get("model") or {}), "key_terms": 4,
                                                          "rule_weight": 0.5}}}
    cfg["rl"] = {**cfg["rl"], "compare_with_parent": False}
    mj = root / "config.model-judge.yaml"
    mj.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    out = root / "mj"
    run.qrewrite("rl", "--config", str(mj), "--tenant", "fivedoctors", "--model", p["sft_merged"],
                 "--data-dir", p["rl_dir"], "--reward-check", p["reward_check"], "--out", str(out / "rl"),
                 "--run-dir", str(out / "run"), "--tb", str(out / "tb"), "--stats", str(out / "stats.json"),
                 "--threads", "1")
    rl = json.loads((out / "stats.json").read_text())
    assert rl["reward"]["rollouts_scored"] == 2 and rl["reward"]["judge_calls"] > 0
    assert (out / "rl" / "lineage.json").is_file()
    lineage = json.loads((out / "rl" / "lineage.json").read_text())
    assert lineage["config"]["reward"]["judge"]["provider"] == "model"
    assert lineage["config"]["reward"]["judge"]["model"]["rule_weight"] == 0.5


# ------------------------------------------------------------------------------------------ secrets

@pytest.mark.slow
def test_the_key_reached_the_api_and_nothing_the_run_wrote_or_printed(run):
    """Every judge and API-candidate request carried the sentinel key; no file in the project (TensorBoard
    events, checkpoints, caches, lineage, reports, logs), $HOME or $TMPDIR, and nothing printed, holds it."""
    reqs = run.fake.requests()
    want = hashlib.sha256(f"Bearer {SENTINEL}".encode()).hexdigest()
    models = {r["model"] for r in reqs}
    assert {"judge-model", "api-model"} <= models, models
    assert reqs and all(r["auth_sha256"] == want for r in reqs)
    tb = list(run.root.glob("logs/tensorboard/*/*/**/events.out.tfevents.*"))
    assert len(tb) >= 4 and (run.root / tenant_paths("chengla")["rl_model"] / "lineage.json").is_file()
    found = leaks([run.root, run.dirs["HOME"], run.dirs["TMPDIR"]], run.printed)
    assert not found, f"the API key leaked into: {found}"


# ------------------------------------------------------------------------------------------ DVC (changes the project: last)

@pytest.mark.slow
def test_dvc_adopts_the_run_and_reruns_only_the_changed_tenant(run):
    """dvc.yaml generated for this project; `dvc commit -f` records the Snakemake-built outputs, after which DVC
    sees everything up to date, and docs/eval-lineage.md's DVC commands run as written with the run env's dvc
    (envs/data.txt, what `make run` installs; the docs put .venv/bin on PATH, the test's PATH does not hold it).
    A changed eval setting reruns eval + report for real; a changed chengla source plans exactly chengla's stages
    and the report (running them for real: the data half in tests/test_dvc.py, to keep this test's time down)."""
    (run.root / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the checkout's env, as `make run` left it
    dvc = [str(run.root / ".venv/bin/dvc")]
    run.tool("git", "init", "-q")
    run.tool(*dvc, "init", "-q")
    shutil.copy(REPO / ".dvcignore", run.root / ".dvcignore")  # as in the checkout: DVC does not walk .venv
    run.tool(*dvc, "config", "cache.type", "hardlink,copy")  # models are large: link, do not copy
    run.tool(sys.executable, "-m", "qrewrite", "dvc-yaml")
    schema = "qrewrite/schemas/config.schema.yaml"  # params of sections config.yaml leaves out (as in a clone)
    (run.root / schema).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / schema, run.root / schema)
    run.tool(*dvc, "commit", "-f")
    status = run.tool(*dvc, "status")
    assert "up to date" in status, status
    docs = fenced(doc_section(REPO / "docs/eval-lineage.md", "DVC"), "bash")[0]
    assert "dvc repro" in docs and "dvc metrics show" in docs and "dvc plots show" in docs, docs
    printed = run_documented(docs, run.root, user_env(**{k: run.env[k] for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME")}))
    run.printed["docs/eval-lineage.md DVC commands"] = printed
    assert not re.findall(r"Running stage '([\w@-]+)'", printed), printed  # up to date: `dvc repro` reran nothing
    assert "reports/fivedoctors/eval.json" in printed and (run.root / "dvc_plots/index.html").is_file()

    cfg = run.project.config
    cfg["eval"]["examples"] = 2
    run.project.set_config(cfg)
    ran = set(re.findall(r"Running stage '([\w@-]+)'", run.tool(*dvc, "repro")))
    assert ran == {"eval@fivedoctors", "eval@chengla", "report"}, ran
    assert max(sum(e["outcome"] == "win" for e in run.project.read_jsonl(eval_paths(t)["examples"])
                   if e["pair"] == "teacher_vs_raw") for t in TENANTS) <= 2
    metrics = run.tool(*dvc, "metrics", "show")
    assert "reports/fivedoctors/eval.json" in metrics and "hit_at_1" in metrics

    src = run.root / "data/demo/chengla.queries.jsonl"
    src.write_text(src.read_text(encoding="utf-8") + '{"query": "雅思课程可以退费吗", "profile": "", "history": "", '
                   '"gold_doc_ids": []}\n', encoding="utf-8")
    # --dry cannot know which outputs a rerun would change, so it lists only the stage whose deps changed now;
    # --force-downstream adds everything downstream of it: the whole plan for a changed chengla source.
    assert set(re.findall(r"Running stage '([\w@-]+)'", run.tool(*dvc, "repro", "--dry"))) == \
        {"build_excel@chengla"}
    planned = set(re.findall(r"Running stage '([\w@-]+)'", run.tool(*dvc, "repro", "--dry", "--force-downstream")))
    expected = {s for s in planned if "chengla" in s} | {"report"}
    assert planned == expected and {"build_excel@chengla", "sft@chengla", "rl@chengla", "eval_generate@chengla-rl",
                                    "eval@chengla", "report"} <= planned, planned
    assert not any("fivedoctors" in s for s in planned) and "base_model" not in planned
