"""The release stage (`qrewrite release`): what a tenant gets, chosen on the validation split only.

The rule itself (qrewrite.release.select) on hand-made scores; then the real command on the data half of the demo
tenant with the tests' tiny model as both students: it never opens the test split (an audit hook records every
file the process opens), the folder holds the rule or the chosen model's own files, the eval scores the release
like any candidate, and the deploy check serves what was released: the rule where pasting the history won
validation, the SFT model (not RL) where SFT tied RL.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, TINY_BASE, Project
from qrewrite.eval.candidates import generation_key
from qrewrite.paths import deploy_json, eval_paths, tenant_paths
from qrewrite.release.advice import advise
from qrewrite.release.score import release_candidates, rewrites
from qrewrite.release.select import choose
from qrewrite.workflow.stages import STAGES, upstream
from test_reward_frameworks import train_python

TENANT = "fivedoctors"
PATHS = tenant_paths(TENANT)
EVAL_PATHS = eval_paths(TENANT)
SFT_RL = f"models/{TENANT}/release-sft-rl"   # SFT against RL alone: a tie
RULE = f"models/{TENANT}/release-rule"      # query + history against SFT, a margin no model can win by: the rule
TEACHER = f"models/{TENANT}/release-teacher"  # the tenant's embedded resolve teacher, alone: a rule with a lexicon
APPENDED = f"models/{TENANT}/release-appended"  # SFT with the history pasted after its rewrite, alone
ROUTED = f"models/{TENANT}/release-routed"  # SFT routed by retrieval, alone


def fig(name: str, mean: float | None, n: int = 30) -> dict:
    return {"name": name, "mean": mean, "n": n if mean is not None else 0}


# ------------------------------------------------------------------------------------------ the rule, pure

def test_a_tie_goes_to_the_earlier_candidate():
    d = choose([fig("query_history", 0.8), fig("sft", 0.8), fig("rl", 0.8)], margin_rows=0.0)
    assert d["name"] == "query_history" and "no later candidate beat" in d["why"]
    assert choose([fig("qh", 0.7), fig("sft", 0.8), fig("rl", 0.8)], 0.0)["name"] == "sft"  # RL ties SFT: SFT


def test_a_later_candidate_must_beat_every_earlier_one_by_the_margin_in_rows():
    # 30 rows: 0.05 is 1.5 rows, 0.02 is 0.6 rows
    figures = [fig("qh", 0.80), fig("sft", 0.85), fig("rl", 0.83)]
    assert choose(figures, 0.0)["name"] == "sft"            # RL beats the rule but not SFT
    assert choose(figures, 1.4)["name"] == "sft"            # 1.5 rows > 1.4
    d = choose(figures, 1.5)
    assert d["name"] == "qh" and d["margin"] == 0.05        # 1.5 rows is not > 1.5
    # a later candidate is held to the best of all earlier ones, not only to the one released so far
    assert choose([fig("qh", 0.80), fig("sft", 0.83), fig("rl", 0.845)], 1.2)["name"] == "qh"
    assert choose([fig("qh", 0.5), fig("sft", 0.9), fig("rl", 0.95)], 0.0)["name"] == "rl"


def test_a_fraction_of_a_row_from_a_broken_tie_is_not_a_win():
    # the held-out entity tenant: SFT + history over plain SFT by 0.00002 on 46 rows (0.001 of a row) was released
    # under the old any-gain rule, and cost 0.055 on test; half a row keeps the earlier
    figures = [fig("sft", 0.630435, n=46), fig("sft+append_history=true", 0.630455, n=46)]
    assert choose(figures, 0.0)["name"] == "sft+append_history=true"
    d = choose(figures, 0.5)
    assert d["name"] == "sft" and "0.5 of 46 rows" in d["why"]
    # a whole row more is a win
    assert choose([fig("sft", 0.630435, n=46), fig("sft+a", 0.630435 + 1 / 46, n=46)], 0.5)["name"] == "sft+a"


def test_without_gold_on_validation_the_first_is_released_and_says_why():
    d = choose([fig("qh", None), fig("sft", None)], 0.5)
    assert d["index"] == 0 and "no validation row has gold" in d["why"]
    with pytest.raises(ValueError):
        choose([], 0.0)


# ------------------------------------------------------------------------------------------ advice, pure

def _cands(*names: str) -> list[dict]:
    return [{"name": n, "source": n.split("+")[0], "kind": "model" if n.startswith(("sft", "rl")) else n,
             "decoding": {"append_history": True} if "append_history" in n else {}} for n in names]


def test_advice_names_the_targets_setting_only_where_every_plain_student_trails_the_rule():
    cands = _cands("query_history", "sft", "sft+append_history=true", "rl")
    trailing = [fig("query_history", 0.874), fig("sft", 0.792), fig("sft+append_history=true", 0.880),
                fig("rl", 0.800)]
    (line,) = advise(trailing, cands, "teacher")
    # the student + the history beat the rule: teach the student to write it
    assert "sft 0.792, rl 0.800 vs 0.874" in line and "sft_targets: history" in line
    assert "sft+append_history=true 0.880" in line
    (line,) = advise(trailing, cands, "retrieval")
    assert "sft_targets: history" in line
    # pasting did not reach the rule: the retrieval-chosen targets, and on those nothing more to name
    pasting_trails = [*trailing[:2], fig("sft+append_history=true", 0.86), trailing[3]]
    (line,) = advise(pasting_trails, cands, "teacher")
    assert "sft_targets: retrieval" in line and "sft_targets: history" not in line
    for targets in ("retrieval", "history"):
        (line,) = advise(pasting_trails, cands, targets)
        assert "trails query_history" in line and "sft_targets" not in line
    (line,) = advise(trailing, cands, "history")
    assert "sft_targets" not in line
    # one plain student at or above the rule (a lever's figure does not count): nothing to advise
    assert advise([fig("query_history", 0.874), fig("sft", 0.792), fig("sft+append_history=true", 0.95),
                   fig("rl", 0.874)], cands, "teacher") == []
    assert advise([fig("query_history", None), fig("sft", None)], _cands("query_history", "sft"), "teacher") == []


# ------------------------------------------------------------------------------------------ append_history

ROWS = [{"query_id": "q1", "query": "是谁", "history": "小林家的龙女仆 / 是动漫"}, {"query_id": "q2", "query": "好", "history": None}]


def test_append_history_pastes_the_history_after_the_same_generation_without_generating_again():
    cands = {c["name"]: c for c in release_candidates({"release": {"candidates": ["sft"], "decoding": [
        {}, {"append_history": True}]}, "eval": {"generation": {"max_new_tokens": 40, "copy_bias": None}}}, {})[0]}
    plain, appended = cands["sft"], cands["sft+append_history=true"]
    # the model's own texts, as the first generation left them: a second one would fail here (there is no model)
    key = ("no-model", generation_key(plain["decoding"]))
    generated = {key: {"q1": "小林家的龙女仆是谁", "q2": "好"}}
    assert rewrites(plain, {}, {}, ROWS, "no-model", 1, generated) == {"q1": "小林家的龙女仆是谁", "q2": "好"}
    assert rewrites(appended, {}, {}, ROWS, "no-model", 1, generated) == {
        "q1": "小林家的龙女仆是谁 小林家的龙女仆 / 是动漫", "q2": "好"}


def test_the_rl_stages_rewrites_are_taken_only_for_exactly_the_same_generation(tmp_path):
    """The rl stage's record of both models' validation rewrites (qrewrite.eval.reuse) stands in for the release's
    generation only where that generation is the same: weights, prompts in order, decoding and device. Here there
    is no model to generate with, so a miss fails the call (`model_rewrites` cannot load it) and a hit does not."""
    from qrewrite.eval import reuse

    tenant = {"system_prompt": "改写", "language": "zh"}
    rows = [{**r, "profile": None} for r in ROWS]
    model = tmp_path / "sft-merged"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    cand, _ = release_candidates({"release": {"candidates": ["sft"], "decoding": [{}, {"append_history": True}]},
                                  "eval": {"generation": {"max_new_tokens": 40, "batch_size": 8}}}, {})
    key = generation_key(cand[0]["decoding"])
    path = tmp_path / "rl-val-rewrites.json"
    reuse.write_generations(str(path), [reuse.record("sft", str(model), tenant, rows, key, "cpu", ["甲", "乙"])])
    cfg = {"train": {"device": "cpu"}}
    reused: set = set()
    got = rewrites(cand[1], cfg, tenant, rows, str(model), 1, {}, str(path), reused)
    assert got == {"q1": "甲 小林家的龙女仆 / 是动漫", "q2": "乙"} and reused == {(str(model), key)}
    assert reuse.reusable(str(path), str(model), tenant, rows, key, "cpu") == {"q1": "甲", "q2": "乙"}
    # each difference is a miss: other rows or order, another decoding, device, system prompt, or weights
    assert reuse.reusable(str(path), str(model), tenant, rows[::-1], key, "cpu") is None
    assert reuse.reusable(str(path), str(model), tenant, rows[:1], key, "cpu") is None
    assert reuse.reusable(str(path), str(model), tenant, rows, (41,) + key[1:], "cpu") is None
    bf16 = generation_key({**cand[0]["decoding"], "dtype": "bfloat16"})  # the weights' dtype changes the rewrites
    assert bf16 != key and reuse.reusable(str(path), str(model), tenant, rows, bf16, "cpu") is None
    assert reuse.reusable(str(path), str(model), tenant, rows, key, "cuda") is None
    assert reuse.reusable(str(path), str(model), {**tenant, "system_prompt": "别的"}, rows, key, "cpu") is None
    assert reuse.reusable(None, str(model), tenant, rows, key, "cpu") is None
    (model / "model.safetensors").write_bytes(b"weights, merged again")
    assert reuse.reusable(str(path), str(model), tenant, rows, key, "cpu") is None
    with pytest.raises(Exception):  # a miss generates: with no model here, that fails
        rewrites(cand[0], cfg, tenant, rows, str(model), 1, {}, str(path))


def test_the_release_links_the_models_files_but_not_the_workflows_marker(tmp_path):
    """Snakemake touches a directory output's .snakemake_timestamp when its job ends: linked into the release, the
    SFT model's marker would be touched with the release's, and the next run would retrain RL from a model that
    looks newer (running make durdev twice did)."""
    from qrewrite.release.folder import write_release

    model = tmp_path / "sft-merged"
    model.mkdir()
    for name in ("model.safetensors", "config.json", ".snakemake_timestamp", "lineage.json"):
        (model / name).write_text(name)
    before = os.stat(model / ".snakemake_timestamp").st_mtime_ns
    out = tmp_path / "release"
    write_release(str(out), {"released": {"name": "sft", "kind": "model"}}, str(model))
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "release.json"]
    assert os.path.samefile(out / "model.safetensors", model / "model.safetensors")
    (out / ".snakemake_timestamp").touch()  # as Snakemake does after the release's job
    os.utime(out / ".snakemake_timestamp", ns=(before + 10**9, before + 10**9))
    assert os.stat(model / ".snakemake_timestamp").st_mtime_ns == before


# ------------------------------------------------------------------------------------------ it never sees test

def test_the_release_stage_is_given_no_test_rows_and_no_eval_output():
    s = STAGES["release"]
    ins = set(s.keys("in"))
    assert ins == {"val", "queries", "sft_merged", "pref_merged", "rl_model", "rl_val_rewrites", "kb"}
    assert not ins & {"test", "eval_split", "rewrites", "all_rewrites", "eval_json", "examples", "plots"}
    assert set(s.keys("out")) == {"release"} and s.half == "models"
    # the eval scores it on test afterwards: the release is upstream of the eval, never the other way round
    assert upstream()["release"][0] == "release"
    assert "release" not in {k for st in STAGES.values() if st.half == "data" for k in st.keys("in")}


# The release command in the swift env's Python, with an audit hook recording every path the process opens
# until the command's own audit event says the choice is written (lineage hashing, which reads every upstream
# file's bytes, comes after it).
AUDITED = """
import json, os, sys
opened = []
decided = []
def hook(event, args):
    if event == "qrewrite.release.decided":
        decided.append(args[0])
    elif event == "open" and not decided and args and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.path.realpath(os.fsdecode(args[0])))
sys.addaudithook(hook)
from qrewrite.cli import main
try:
    rc = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as fh:
        json.dump({"opened": opened, "decided": decided}, fh)
sys.exit(rc)
"""


@pytest.fixture(scope="module")
def released(tmp_path_factory, smollm2_base):
    """The demo tenant's data half (60 queries), the tiny model as both students, then four releases: the shipped
    candidates (query + history, the teacher's rule, SFT, RL with two decodings each), SFT against RL alone, the
    rule (a margin of more rows than there are, with copy bias), SFT with the history pasted, the teacher alone."""
    py = train_python("swift")
    root = tmp_path_factory.mktemp("release")
    project = Project(root / "proj")
    project.keep_queries(TENANT, 60)
    cfg = project.config
    cfg["base_model"] = dict(TINY_BASE)
    cfg["eval"]["generation"].update({"max_new_tokens": 8, "batch_size": 8})  # plumbing, not quality
    project.set_config(cfg)
    # the split's rows only; under the gate's floor of training rows: the release's plumbing, not quality
    project.update_tenant(TENANT, judge_labels=None, gold_set=None, red_team=None, student="always")
    # the data half and the RL prompts: the release's lineage walks back through them to the raw Excel
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check", "summarize", "data-card",
                  "training-gate", "sft-targets", "rl-data"):
        project.stage(stage)
    (project.root / PATHS["sft_model"]).mkdir(parents=True)  # the adapter stands in empty: only hashed here
    (project.root / PATHS["sft_model"] / "adapter_config.json").write_text("{}")
    os.symlink(smollm2_base, project.root / "models" / "base")
    for key in ("sft_merged", "rl_model"):  # the same tiny model twice: RL can only tie SFT
        os.symlink(smollm2_base, project.root / PATHS[key])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

    def release(out: str, opened: Path, **release_cfg) -> dict:
        c = project.config
        c["release"] = {**c["release"], **release_cfg}
        project.set_config(c)
        argv = ["release", "--config", "config.yaml", "--tenant", TENANT, "--val", PATHS["val"], "--queries",
                PATHS["queries"], "--sft", PATHS["sft_merged"], "--rl", PATHS["rl_model"], "--out", out,
                "--threads", "1"]
        proc = subprocess.run([str(py), "-c", AUDITED, str(opened), *argv], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads((project.root / out / "release.json").read_text(encoding="utf-8"))

    shipped = release(PATHS["release"], root / "opened_shipped.json")
    sft_vs_rl = release(SFT_RL, root / "opened_sft_rl.json", candidates=["sft", "rl"], decoding=[{}])
    # validation prefers the rule whatever the tiny model writes: a model would have to win by more rows than there
    # are (and a generation lever, copy bias, no longer among the shipped ones, still generates and is recorded)
    release(RULE, root / "opened_rule.json", candidates=["query_history", "sft"], margin_rows=1000.0,
            decoding=[{}, {"copy_bias": 1.0}])
    appended = release(APPENDED, root / "opened_appended.json", candidates=["sft"], decoding=[{"append_history": True}])
    release(ROUTED, root / "opened_routed.json", candidates=["sft"], decoding=[{"route_by_retrieval": True}])
    release(TEACHER, root / "opened_teacher.json", candidates=["teacher"])
    return project, root, shipped, sft_vs_rl, appended


@pytest.mark.slow
def test_the_release_never_opens_the_test_split(released):
    project, root, *_ = released
    test_split = os.path.realpath(project.root / PATHS["test"])
    val_split = os.path.realpath(project.root / PATHS["val"])
    assert Path(test_split).is_file()  # it is there to be read: the stage does not
    for name in ("opened_shipped.json", "opened_sft_rl.json", "opened_rule.json", "opened_routed.json",
                 "opened_teacher.json"):
        audit = json.loads((root / name).read_text())
        assert len(audit["decided"]) == 1, name  # the event came, once: the phase before it is the choice
        opened = set(audit["opened"])
        assert val_split in opened, name  # the hook does see the files the stage reads
        assert test_split not in opened, name
        assert not [p for p in opened if "/reports/" in p or f"/results/{TENANT}/eval/" in p], name


@pytest.mark.slow
def test_the_release_records_every_candidate_on_validation_and_the_rule(released):
    project, _, shipped, *_ = released
    names = [c["name"] for c in shipped["candidates"]]
    assert names == ["query_history", "raw", "teacher", "sft", "sft+append_history=true", "sft+route_by_retrieval=true", "rl",
                     "rl+append_history=true", "rl+route_by_retrieval=true"]
    n_val = len(project.read_jsonl(PATHS["val"]))
    assert shipped["split"] == "val" and shipped["n_val_rows"] == n_val and 0 < shipped["n_with_gold"] <= n_val
    for c in shipped["candidates"]:
        assert c["n"] == shipped["n_with_gold"] and c["ci_low"] <= c["mean"] <= c["ci_high"]
    # the decision is the rule's on the recorded figures, not something else
    decision = choose(shipped["candidates"], shipped["decision"]["margin_rows"])
    assert shipped["released"]["name"] == decision["name"] and shipped["decision"]["why"] == decision["why"]
    assert "otherwise the earlier keeps it" in shipped["decision"]["rule"]
    # config.yaml lists the preference model, whose stage is off: left out, saying why
    assert shipped["left_out"] == {"pref": "pref.enabled is false: the preference stage did not run"}
    assert shipped["advice"] == advise(shipped["candidates"], shipped["candidates"], "teacher")
    lineage = json.loads((project.root / PATHS["release"] / "lineage.json").read_text(encoding="utf-8"))
    assert lineage["model"]["rule"] == "release" and set(lineage["inputs"]) == {"val", "queries", "sft", "rl"}
    assert lineage["params"]["released"]["name"] == shipped["released"]["name"]
    assert [v["name"] for v in lineage["params"]["validation"]] == names
    out = project.qrewrite("lineage", "verify", PATHS["release"]).stdout
    assert out.startswith(f"OK {PATHS['release']}"), out


@pytest.mark.slow
def test_an_sft_that_ties_rl_is_released_as_sft_with_its_own_files(released):
    project, _, _, sft_vs_rl, _ = released
    a, b = sft_vs_rl["candidates"]
    assert a["mean"] == b["mean"]  # the same model twice
    assert sft_vs_rl["released"]["name"] == "sft" and sft_vs_rl["released"]["artifact"] == "sft_merged"
    folder = project.root / SFT_RL
    weights = [p for p in folder.glob("*.safetensors")]
    assert weights and (folder / "config.json").is_file()
    for w in weights:  # linked, not copied: the SFT model's own bytes
        assert os.path.samefile(w, Path(os.path.realpath(project.root / PATHS["sft_merged"])) / w.name)


@pytest.mark.slow
def test_the_teacher_released_as_a_rule_answers_as_the_teacher_stage_wrote(released):
    """Where the tenant's teacher is the embedded resolver, it is a release candidate. Released, its lexicon is
    frozen in the folder, and the runtime (the gateway's, the eval's) answers each row as the teacher stage did."""
    import asyncio

    from qrewrite.config import load_config
    from qrewrite.runtime.release import load_served

    project, *_ = released
    folder = project.root / TEACHER
    doc = json.loads((folder / "release.json").read_text(encoding="utf-8"))
    assert doc["released"]["kind"] == "rule" and doc["released"]["rule"] == "resolve"
    assert doc["released"]["state"] == "entities.json" and (folder / "entities.json").is_file()
    out = project.qrewrite("lineage", "verify", TEACHER).stdout
    assert out.startswith(f"OK {TEACHER}"), out  # the frozen lexicon is one of the files the lineage hashed
    cfg = load_config(project.root / "config.yaml")
    tenant = next(t for t in cfg["tenants"] if t["name"] == TENANT)
    tenant = {**tenant, "kb": {**tenant["kb"], "path": str(project.root / tenant["kb"]["path"])}}
    served = load_served(cfg, tenant, str(folder))
    taught = {r["id"]: r["rewrite"] for r in project.read_jsonl(PATHS["teacher"])}
    rows = project.read_jsonl(PATHS["queries"])[:40]
    answers = [asyncio.run(served.answer(r, timeout_s=5, on_backend_error="raise")) for r in rows]
    assert [a["rewrite"] for a in answers] == [taught[r["id"]] for r in rows]
    assert sum(a["rewrite"] != r["query"] for a, r in zip(answers, rows)) >= 10  # it resolved something


def test_only_a_teacher_that_runs_without_a_paid_call_is_a_release_candidate():
    cfg = {"release": {"candidates": ["query_history", "teacher"], "decoding": [{}]}, "eval": {"generation": {}},
           "teacher": {"provider": "resolve"}}
    cands, left = release_candidates(cfg, {"name": "t"})
    assert [c["kind"] for c in cands] == ["query_history", "resolve"] and left == {}
    for provider in ("openai", "prf", "column"):
        cands, left = release_candidates(cfg, {"name": "t", "teacher": {"provider": provider}})
        assert [c["name"] for c in cands] == ["query_history"] and provider in left["teacher"]


def test_a_rule_release_without_its_frozen_lexicon_is_refused(tmp_path):
    from qrewrite.errors import QrewriteError
    from qrewrite.runtime.rules import load_rule

    assert load_rule("raw", tmp_path)({"query": "q"}) == "q"
    with pytest.raises(QrewriteError, match="frozen"):
        load_rule("resolve", tmp_path)
    with pytest.raises(QrewriteError, match="does not know"):
        load_rule("teacher", tmp_path)


def base_args() -> list[str]:
    return ["--config", "config.yaml", "--tenant", TENANT, "--test", PATHS["test"], "--queries", PATHS["queries"]]


@pytest.mark.slow
def test_the_eval_generates_with_the_released_model_and_its_decoding_as_served(released):
    """The eval's release rows are what the gateway answers: the released model's decoding, each row generated
    alone (batch 1, as a served request; every row's latency timed), never another candidate's batched rows."""
    project, _, _, sft_vs_rl, _ = released
    out = EVAL_PATHS["rewrites"].format(candidate="release")
    project.qrewrite("eval-generate", *base_args(), "--candidate", "release", "--model", SFT_RL, "--threads", "1",
                     "--out", out)
    rows = project.read_jsonl(out)
    assert len(rows) == len(project.read_jsonl(PATHS["test"])) and {r["released"] for r in rows} == {"sft"}
    assert {r["model"] for r in rows} == {SFT_RL} and {r["kind"] for r in rows} == {"release"}
    assert all(r["generation"]["max_new_tokens"] == sft_vs_rl["released"]["decoding"]["max_new_tokens"] for r in rows)
    assert {r["generation"]["batch_size"] for r in rows} == {1} and all(r["latency_s"] > 0 for r in rows)
    assert not any("reused_from" in r for r in rows)
    # the release and its rows name the engine that serves it (qrewrite.runtime), the one that generated them
    assert sft_vs_rl["released"]["engine"] == "transformers-batched"
    assert {r["generation"]["engine"] for r in rows} == {"transformers-batched"}


def release_eval_rows(project: Project, folder: str) -> tuple[list[dict], dict]:
    """The eval's release candidate generated with the release in `folder`: (its rows, queries by id)."""
    out = EVAL_PATHS["rewrites"].format(candidate="release")
    project.qrewrite("eval-generate", *base_args(), "--candidate", "release", "--model", folder, "--threads", "1",
                     "--out", out)
    return project.read_jsonl(out), {r["id"]: r for r in project.read_jsonl(PATHS["queries"])}


@pytest.mark.slow
def test_a_release_with_append_history_pastes_the_history_after_the_models_text(released):
    """The eval's release candidate where the release chose append_history: the model's own rewrite of each row,
    with the row's history summary pasted after it (an empty one sends query + history, marked)."""
    project, _, _, _, appended = released
    assert appended["released"]["name"] == "sft+append_history=true"
    assert appended["released"]["decoding"]["append_history"] is True
    rows, queries = release_eval_rows(project, APPENDED)
    assert rows and {r["released"] for r in rows} == {appended["released"]["name"]}
    for r in rows:
        q = queries[r["query_id"]]
        if r.get("fallback") == "empty":
            assert r["rewrite"] == f"{q['query']} {q['history'] or ''}".strip()
        else:
            assert r["rewrite"] == f"{r['model_rewrite']} {q['history'] or ''}".strip()


@pytest.mark.slow
def test_a_release_routed_by_retrieval_routes_each_row(released, monkeypatch):
    """The eval's release candidate where the release chose route_by_retrieval: each row sent as the text whose
    top hit the tenant's RAG scores highest among the model's own rewrite, it + the history and query + history
    (qrewrite.runtime.route, recomputed here)."""
    from qrewrite.config import load_config, tenant_config
    from qrewrite.runtime.route import PARTS, client_rows, part_texts

    project, *_ = released
    routed = json.loads((project.root / ROUTED / "release.json").read_text(encoding="utf-8"))
    assert routed["released"]["name"] == "sft+route_by_retrieval=true"
    rows, queries = release_eval_rows(project, ROUTED)
    assert rows
    for r in rows:
        assert r["routed_to"] in PARTS
        assert r["rewrite"] == part_texts(r["model_rewrite"], {**queries[r["query_id"]], **r})[r["routed_to"]] \
            or r.get("fallback") == "empty"
    monkeypatch.chdir(project.root)  # the config's relative KB path
    cfg = load_config("config.yaml")
    again = client_rows({"route_by_retrieval": True}, cfg, tenant_config(cfg, TENANT),
                        [{**queries[r["query_id"]], **r} for r in rows], [r["model_rewrite"] for r in rows])
    assert [a["rewrite"] for a in again] == [r["rewrite"] for r in rows]


@pytest.mark.slow
def test_a_released_rule_is_scored_and_served_as_the_rule(released):
    """The eval's release candidate and `snakemake deploy`'s default (deploy.candidate: release) where pasting the
    history won validation: the rule's rewrites, and a deploy check that serves the rule, not a model."""
    project, *_ = released
    rule = json.loads((project.root / RULE / "release.json").read_text(encoding="utf-8"))
    assert rule["released"] == {"name": "query_history", "source": "query_history", "kind": "rule",
                                "rule": "query_history", "sends": rule["released"]["sends"]}
    assert [c["name"] for c in rule["candidates"]] == ["query_history", "sft", "sft+copy_bias=1.0"]
    assert not list((project.root / RULE).glob("*.safetensors"))  # a rule: no model in the folder
    out = EVAL_PATHS["rewrites"].format(candidate="release")
    project.qrewrite("eval-generate", *base_args(), "--candidate", "release", "--model", RULE, "--threads", "1",
                     "--out", out)
    rows = project.read_jsonl(out)
    queries = {r["id"]: r for r in project.read_jsonl(PATHS["queries"])}
    assert rows and all(r["rewrite"] == f"{queries[r['query_id']]['query']} {queries[r['query_id']]['history'] or ''}"
                        .strip() for r in rows)
    c = project.config
    c["eval"].update({"candidates": [{"name": "release", "kind": "release"}], "baseline": "release", "compare": [],
                      "headline": ["release"], "judge_sample_share": 0.0})
    project.set_config(c)
    project.stage("reward-check")
    project.qrewrite("eval", *base_args(), "--teacher", PATHS["teacher"], "--reward-check", PATHS["reward_check"],
                     "--rewrites", out, "--out", EVAL_PATHS["eval_json"], "--examples", EVAL_PATHS["examples"],
                     "--plots", EVAL_PATHS["plots"])
    ev = json.loads((project.root / EVAL_PATHS["eval_json"]).read_text(encoding="utf-8"))
    assert ev["candidates"]["release"]["released"] == "query_history"
    assert ev["candidates"]["release"]["cost_per_1k_usd"] == 0.0
    c = project.config
    c["deploy"] = {"concurrency": [1, 4]}
    project.set_config(c)
    project.qrewrite("deploy-check", *base_args(), "--model", RULE, "--eval-json", EVAL_PATHS["eval_json"],
                     "--eval-rewrites", out, "--server-log", f"logs/{TENANT}/deploy_server.log",
                     "--out", deploy_json(TENANT))
    doc = json.loads((project.root / deploy_json(TENANT)).read_text(encoding="utf-8"))
    # the gateway answers the rule itself: no model, no model server
    assert doc["released"]["kind"] == "rule" and doc["gateway"]["backend"] == "rule" and doc["model_server"] is None
    assert doc["hit_at_1"]["served"] == ev["candidates"]["release"]["hit_at_1"]["mean"] is not None
    assert doc["texts_identical_to_eval"] and doc["release_id"].startswith(f"{TENANT}/query_history@")
    assert doc["production"]["vllm"] == [] and set(doc["latency"]) == {"1", "4"}
