"""Evaluation: candidates' rewrites, metrics against an independent recomputation, intervals and paired tests,
API candidates through a (fake, loopback) OpenAI-compatible server, a real local model through transformers."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest
import yaml

from conftest import Project
from qrewrite import stats
from qrewrite.paths import eval_paths, tenant_paths

TENANT = "fivedoctors"
PATHS = tenant_paths(TENANT)
EVAL_PATHS = eval_paths(TENANT)


def cfg_with_eval(project: Project, name: str, *, without_sets: bool = False, **eval_cfg) -> str:
    """Write config `name` = the project's config with `eval:` replaced; return its file name. `without_sets`:
    no gold or red-team set, so a candidate rewrites the test rows only (a local model at batch 1 is slow)."""
    cfg = project.config
    cfg["eval"] = eval_cfg
    if without_sets:
        for t in cfg["tenants"]:
            t["gold_set"] = t["red_team"] = None
    (project.root / name).write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return name


def rewrites(project: Project, config: str, candidate: str, *extra: str, check: bool = True, env=None):
    """`qrewrite eval-generate` for a local model (`--model` in `extra`), else `qrewrite eval-rewrites`."""
    out = EVAL_PATHS["rewrites"].format(candidate=candidate)
    command, source = ("eval-generate", []) if "--model" in extra else ("eval-rewrites", ["--teacher", PATHS["teacher"]])
    return project.qrewrite(command, "--config", config, "--tenant", TENANT, "--candidate", candidate,
                            "--test", PATHS["test"], "--queries", PATHS["queries"], *source, "--out", out,
                            *extra, check=check, env=env), out


def run_eval(project: Project, config: str, files: list[str], check: bool = True, env=None):
    return project.qrewrite("eval", "--config", config, "--tenant", TENANT, "--test", PATHS["test"], "--queries",
                            PATHS["queries"], "--teacher", PATHS["teacher"], "--reward-check", PATHS["reward_check"],
                            "--rewrites", *files, "--out", EVAL_PATHS["eval_json"], "--examples",
                            EVAL_PATHS["examples"], "--plots", EVAL_PATHS["plots"], check=check, env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The data half for one tenant (60 queries) in a scratch project."""
    project = Project(tmp_path_factory.mktemp("eval") / "proj")
    project.keep_queries(TENANT, 60)
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check"):
        project.stage(stage)
    return project


# ------------------------------------------------------------------------------------------------ statistics

def test_mean_ci_is_seeded_and_brackets_the_mean():
    x = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    a = stats.mean_ci(x, samples=2000, seed=3, confidence=0.95)
    assert a == stats.mean_ci(x, samples=2000, seed=3, confidence=0.95)
    assert a["mean"] == 0.7 and a["ci_low"] < 0.7 < a["ci_high"] and 0 <= a["ci_low"] and a["ci_high"] <= 1
    assert stats.mean_ci([None, None], samples=200, seed=0, confidence=0.9)["mean"] is None
    assert stats.mean_ci([0.5, None], samples=200, seed=0, confidence=0.9)["n"] == 1


def test_sign_flip_p_matches_brute_force_enumeration():
    d = np.array([0.3, -0.1, 0.2, 0.25, 0.0, 0.4, -0.05])
    obs = abs(d.mean())
    flips = [abs(np.mean(np.array(s) * d)) >= obs - 1e-12 for s in itertools.product((1, -1), repeat=d.size)]
    assert stats.sign_flip_p(d, seed=0) == pytest.approx(sum(flips) / len(flips))


def test_paired_comparison_separates_a_real_difference_from_none():
    rng = np.random.default_rng(1)
    b = rng.uniform(0, 1, 40)
    better = stats.paired(list(b + 0.2), list(b), samples=2000, seed=0, confidence=0.95)
    assert better["diff"] == pytest.approx(0.2) and better["ci_low"] > 0 and better["p_value"] < 0.001
    assert better["a_better"] == 40 and better["b_better"] == 0
    same = stats.paired(list(b), list(b), samples=2000, seed=0, confidence=0.95)
    assert same["diff"] == 0 and same["p_value"] == 1.0
    noisy = stats.paired(list(b + rng.normal(0, 0.3, 40)), list(b), samples=2000, seed=0, confidence=0.95)
    assert noisy["ci_low"] < noisy["diff"] < noisy["ci_high"]
    # pairs with a missing side are left out, not counted as 0
    assert stats.paired([1.0, None, 0.0], [0.0, 1.0, None], samples=200, seed=0, confidence=0.9)["n"] == 1


# --------------------------------------------------------------------------------------- candidates + scoring

def test_rank_metrics_at_the_cutoffs():
    """Hit@1 / Hit@5 / reciprocal rank from the gold document's rank; a query without gold docs has none."""
    import asyncio

    from qrewrite.eval.score import _score_candidate
    from qrewrite.reward.judge_rules import RuleJudge

    class StubRag:  # TEST FAKE: returns scripted hit lists, best first
        order = {"q1": ["g", "a", "b", "c", "d"], "q5": ["a", "b", "c", "d", "g"], "qx": ["a", "b", "c", "d", "e"],
                 "qn": ["a"], "qt": ["a", "g", "b"]}

        async def search(self, query, rewrite):
            if query == "qt":  # gold tied with "a" at the top: the expectation over the order, not list order
                return [{"doc_id": d, "reranker_score": s} for d, s in zip(self.order[query], (0.9, 0.9, 0.1))]
            return [{"doc_id": d, "reranker_score": 1.0 - 0.1 * i} for i, d in enumerate(self.order[query])]

    qs = ("q1", "q5", "qx", "qn", "qt")
    rows = [{"query_id": q, "query": q, "profile": "", "history": "", "gold_doc_ids": [] if q == "qn" else ["g"]}
            for q in qs]
    rws = {q: {"status": "ok", "rewrite": q + " rewritten"} for q in qs}
    out = {s["query_id"]: s for s in asyncio.run(_score_candidate(StubRag(), RuleJudge(), rows, rws, 0.0, "seed"))}
    assert (out["qt"]["hit_at_1"], out["qt"]["hit_at_5"], out["qt"]["mrr"]) == (0.5, 1.0, 0.75)
    assert out["qt"]["gold_rank"] == 2 and out["qt"]["gold_tied"] == 2  # ties count against it in the display rank
    assert (out["q1"]["hit_at_1"], out["q1"]["hit_at_5"], out["q1"]["mrr"]) == (1.0, 1.0, 1.0)
    assert (out["q5"]["hit_at_1"], out["q5"]["hit_at_5"], out["q5"]["mrr"]) == (0.0, 1.0, 0.2)
    assert (out["qx"]["hit_at_1"], out["qx"]["hit_at_5"], out["qx"]["mrr"]) == (0.0, 0.0, 0.0)
    assert (out["qn"]["hit_at_1"], out["qn"]["hit_at_5"], out["qn"]["mrr"]) == (None, None, None)
    assert out["q1"]["top1"] == 1.0 and out["q1"]["mean_top3"] == pytest.approx(0.9)
    assert out["q1"]["quality"] == pytest.approx(0.6 * 1.0 + 0.4 * 0.9)  # rag.quality seed
    assert out["qn"]["mean_top3"] == pytest.approx(1 / 3)  # missing positions count 0
    assert all(s["judge"] is None for s in out.values())  # share 0: nothing judged



@pytest.mark.slow
def test_metrics_match_an_independent_recomputation(data):
    """raw and teacher through `qrewrite eval`: Hit@1/Hit@5/MRR/top1 equal what validate.jsonl recorded for the
    same rewrites through the same local RAG; the teacher against itself is all ties; latency and cost come
    from the teacher rows."""
    cfg = cfg_with_eval(data, "c_basic.yaml", candidates=[{"name": "raw", "kind": "raw"},
                                                         {"name": "teacher", "kind": "teacher"},
                                                         {"name": "query_history", "kind": "query_history"}],
                        compare=[["teacher", "raw"]], headline=["teacher", "raw"])
    files = [rewrites(data, cfg, c)[1] for c in ("raw", "teacher", "query_history")]
    run_eval(data, cfg, files)
    doc = json.loads((data.root / EVAL_PATHS["eval_json"]).read_text())
    test_ids = [s["meta"]["query_id"] for s in data.read_jsonl(PATHS["test"])]
    validated = {v["id"]: v for v in data.read_jsonl(PATHS["validated"])}
    teacher_rows = {t["id"]: t for t in data.read_jsonl(PATHS["teacher"])}
    assert doc["n_queries"] == len(test_ids) > 0
    def expected(hits, gold):
        """Independent tie rule: the gold document's position is uniform over its group of equal scores."""
        (g,) = gold
        scores = {h["doc_id"]: h["reranker_score"] for h in hits}
        if g not in scores:
            return 0.0, 0.0, 0.0
        above = sum(s > scores[g] for s in scores.values())
        positions = [above + j for j in range(1, sum(s == scores[g] for s in scores.values()) + 1)]
        return (np.mean([p == 1 for p in positions]), np.mean([p <= 5 for p in positions]),
                np.mean([1 / p for p in positions]))

    for cand, side in (("teacher", "rewrite_rag"), ("raw", "original_rag")):
        exp = np.array([expected(validated[q][side]["hits"], validated[q]["gold_doc_ids"]) for q in test_ids])
        c = doc["candidates"][cand]
        assert c["hit_at_1"]["mean"] == pytest.approx(exp[:, 0].mean(), abs=1e-6)
        assert c["hit_at_5"]["mean"] == pytest.approx(exp[:, 1].mean(), abs=1e-6)
        assert c["mrr"]["mean"] == pytest.approx(exp[:, 2].mean(), abs=1e-6)
        assert c["hit_at_1"]["mean"] == pytest.approx(np.mean([validated[q][side]["hit_at_1"] for q in test_ids]),
                                                      abs=1e-6)
        assert c["top1"]["mean"] == pytest.approx(np.mean([validated[q][side]["top1"] for q in test_ids]), abs=1e-5)
        assert c["hit_at_1"]["ci_low"] <= c["hit_at_1"]["mean"] <= c["hit_at_1"]["ci_high"]
    t = doc["candidates"]["teacher"]
    assert t["vs_teacher"] == {"win": 0, "tie": len(test_ids), "loss": 0, "win_rate": 0.0, "loss_rate": 0.0}
    lat = sorted(teacher_rows[q]["latency_s"] for q in test_ids)
    assert t["latency_s"]["p50"] == pytest.approx(float(np.percentile(lat, 50)), abs=1e-6)
    assert t["cost_per_1k_usd"] == 0.0 and doc["candidates"]["raw"]["cost_per_1k_usd"] == 0.0
    # raw vs teacher outcomes agree with the q values validate.jsonl recorded
    wins = sum(validated[q]["original_rag"]["quality"] > validated[q]["rewrite_rag"]["quality"] + 1e-9 for q in test_ids)
    assert doc["candidates"]["raw"]["vs_teacher"]["win"] == wins
    # the judge (the reward's rule judge) scored every query of every candidate, on 1..5
    assert doc["judge"]["provider"] == "rule" and doc["judge"]["judged_queries"] == len(test_ids)
    assert 1 <= t["judge"]["mean"] <= 5
    cmp = doc["comparisons"]["teacher_vs_raw"]["hit_at_1"]
    assert cmp["n"] == len(test_ids) and cmp["ci_low"] <= cmp["diff"] <= cmp["ci_high"]
    examples = data.read_jsonl(EVAL_PATHS["examples"])
    assert examples and {e["outcome"] for e in examples} <= {"win", "loss"}
    assert all(set(e["candidates"]) == {"raw", "teacher", "query_history"} for e in examples)
    wins_shown = [e["delta_quality"] for e in examples if e["outcome"] == "win"]
    assert wins_shown == sorted(wins_shown, reverse=True)
    plots = json.loads((data.root / EVAL_PATHS["plots"]).read_text())
    assert [p["candidate"] for p in plots] == ["raw", "teacher", "query_history"]
    # the tie rule is stated; the query + history baseline is the query with the history pasted after it
    assert "random tie-breaking" in doc["tie_rule"] and doc["rag"]["quality"] == "top1"
    qh = {r["query_id"]: r["rewrite"] for r in data.read_jsonl(EVAL_PATHS["rewrites"].format(candidate="query_history"))}
    queries = {q["id"]: q for q in data.read_jsonl(PATHS["queries"])}
    assert all(qh[q] == f"{queries[q]['query']} {queries[q]['history']}".strip() for q in test_ids)
    assert doc["candidates"]["query_history"]["cost_per_1k_usd"] == 0.0
    # the judge's checks from reward_check.json: derived labels per kind of bad, the tenant's labelled set
    # (config tenants[].judge_labels) all and held out, the reward's preference
    sig = doc["signals"]
    lab = sig["judge"]["labelled"]
    assert lab["path"].endswith("fivedoctors.judge_labels.jsonl") and lab["all"]["auc"] >= 0.9
    # 60 of 240 demo queries kept: a labelled question the teacher never rewrote is left out and counted
    assert lab["all"]["n_good"] + lab["all"]["n_bad"] + lab["no_reference"] == 122 and lab["all"]["n_bad"] >= 30
    assert set(sig["judge"]["derived"]["by_failure"]) == {"raw", "other_row"} and sig["reward"]["preference"] >= 0.85
    assert sig["reward_check"]["judge_auc_derived"] == sig["judge"]["derived"]["auc"]
    # every candidate judged against the teacher's rewrite: the teacher's own rewrites score 5 on form-clean rows
    assert doc["candidates"]["teacher"]["judge"]["mean"] > doc["candidates"]["raw"]["judge"]["mean"]


@pytest.mark.slow
def test_a_failed_teacher_row_is_scored_as_no_rewrite_never_as_the_query(data, tmp_path):
    cfg = cfg_with_eval(data, "c_fail.yaml", candidates=[{"name": "raw", "kind": "raw"},
                                                        {"name": "teacher", "kind": "teacher"}],
                        compare=[["teacher", "raw"]], headline=["teacher"])
    test_ids = [s["meta"]["query_id"] for s in data.read_jsonl(PATHS["test"])]
    rows = data.read_jsonl(PATHS["teacher"])
    broken = [dict(r, status="error", reason="HTTP 500", rewrite=None) if r["id"] == test_ids[0] else r for r in rows]
    bad = "results/fivedoctors/teacher.broken.jsonl"
    (data.root / bad).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in broken), encoding="utf-8")
    out = "results/fivedoctors/eval/teacher.broken.jsonl"
    data.qrewrite("eval-rewrites", "--config", cfg, "--tenant", TENANT, "--candidate", "teacher", "--test", PATHS["test"],
                  "--queries", PATHS["queries"], "--teacher", bad, "--out", out)
    row = next(r for r in data.read_jsonl(out) if r["query_id"] == test_ids[0])
    assert row["status"] == "error" and row["rewrite"] is None
    raw = rewrites(data, cfg, "raw")[1]
    run_eval(data, cfg, [raw, out])
    doc = json.loads((data.root / EVAL_PATHS["eval_json"]).read_text())
    assert doc["candidates"]["teacher"]["errors"] == 1
    assert doc["candidates"]["raw"]["errors"] == 0


@pytest.mark.slow
def test_config_and_input_errors_are_clear(data):
    cfg = cfg_with_eval(data, "c_bad.yaml", candidates=[{"name": "raw", "kind": "raw"}], baseline="teacher",
                        compare=[], headline=[])
    proc, _ = rewrites(data, cfg, "raw", check=False)
    assert proc.returncode == 2 and "eval.baseline" in proc.stderr and "'teacher' is not an eval candidate" in proc.stderr
    cfg = cfg_with_eval(data, "c_two.yaml", candidates=[{"name": "raw", "kind": "raw"},
                                                       {"name": "teacher", "kind": "teacher"}],
                        compare=[["teacher", "raw"]], headline=["teacher"])
    raw = rewrites(data, cfg, "raw")[1]
    proc = run_eval(data, cfg, [raw], check=False)
    assert proc.returncode == 2 and "no rewrites given for candidates ['teacher']" in proc.stderr
    proc, _ = rewrites(data, cfg, "nope", check=False)
    assert proc.returncode == 2 and "no eval candidate named 'nope'" in proc.stderr
    cfg = cfg_with_eval(data, "c_model.yaml", candidates=[{"name": "m", "kind": "model"}], baseline="m",
                        compare=[], headline=[])
    proc, _ = rewrites(data, cfg, "m", check=False)
    assert proc.returncode == 2 and "eval.candidates.0" in proc.stderr  # kind model needs artifact or path
    # each rule's subcommand takes only its own kinds (they run in different envs and containers)
    cfg = cfg_with_eval(data, "c_kinds.yaml", candidates=[{"name": "raw", "kind": "raw"},
                                                         {"name": "m", "kind": "model", "path": "models/m"}],
                        baseline="raw", compare=[], headline=[])
    proc, _ = rewrites(data, cfg, "m", check=False)
    assert proc.returncode == 2 and "use `qrewrite eval-generate`" in proc.stderr
    proc, _ = rewrites(data, cfg, "raw", "--model", "models/m", check=False)
    assert proc.returncode == 2 and "use `qrewrite eval-rewrites`" in proc.stderr


@pytest.mark.slow
def test_api_candidate_and_api_judge_through_an_openai_compatible_server(data, fake_openai):
    """A teacher behind an API is a candidate: rewrites, latency and price-table cost from the API, cached (a
    rerun sends nothing). The judge is the reward's OpenAI judge on a sampled half of the queries, the same
    queries for every candidate."""
    fake_openai.script(replies={"<data>": '{"score": 4, "reason": "ok"}'})
    api = {"base_url": fake_openai.url, "model": "test-model", "api_key_env": "FAKE_KEY", "max_retries": 1}
    cfg = data.config
    cfg["teacher"]["prices"] = {"test-model": {"input_per_1m": 2.0, "output_per_1m": 8.0}}
    cfg["reward"] = {"judge": {"provider": "openai", "openai": dict(api, max_retries=1)},
                     "cache_dir": "cache/reward-api"}
    cfg["eval"] = {"candidates": [{"name": "raw", "kind": "raw"}, {"name": "teacher", "kind": "teacher"},
                                  {"name": "api", "kind": "openai", "openai": api}],
                   "compare": [["api", "teacher"]], "headline": ["teacher", "api"], "judge_sample_share": 0.5,
                   "cache_dir": "cache/eval-api"}
    (data.root / "c_api.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    env = {"FAKE_KEY": "sk-test-not-a-real-key"}
    _, out = rewrites(data, "c_api.yaml", "api", env=env)
    n_test = len(data.read_jsonl(PATHS["test"]))
    sent = len(fake_openai.requests())
    from qrewrite.config import load_config, tenant_config
    from qrewrite.eval.candidates import extra_rows

    n_extra = len(extra_rows(tenant_config(load_config(data.root / "c_api.yaml"), TENANT)))  # gold + red-team rows
    assert sent == n_test + n_extra
    all_rows = data.read_jsonl(out)
    rows = [r for r in all_rows if r["set"] == "test"]
    assert len(rows) == n_test
    assert all(r["status"] == "ok" and r["rewrite"].startswith("改写：") for r in rows)
    r = rows[0]
    assert r["cost_usd"] == pytest.approx(r["usage"]["prompt_tokens"] * 2e-6 + r["usage"]["completion_tokens"] * 8e-6)
    assert r["latency_s"] > 0
    rewrites(data, "c_api.yaml", "api", env=env)
    assert len(fake_openai.requests()) == sent  # cached
    assert data.read_jsonl(out) == all_rows
    files = [rewrites(data, "c_api.yaml", c, env=env)[1] for c in ("raw", "teacher")] + [out]
    run_eval(data, "c_api.yaml", files, env=env)
    doc = json.loads((data.root / EVAL_PATHS["eval_json"]).read_text())
    judged = doc["judge"]["judged_queries"]
    assert doc["judge"]["provider"] == "openai" and 0 < judged < n_test
    for name in ("raw", "teacher", "api"):
        assert doc["candidates"][name]["judge"] == {**doc["candidates"][name]["judge"], "mean": 4.0, "n": judged}
    assert doc["comparisons"]["api_vs_teacher"]["judge"]["n"] == judged
    api_c = doc["candidates"]["api"]
    assert api_c["cost_per_1k_usd"] == pytest.approx(1000 * np.mean([x["cost_usd"] for x in rows]), abs=1e-6)  # 6 decimals
    assert api_c["model"] == "openai/test-model"
    assert "sk-test-not-a-real-key" not in (data.root / EVAL_PATHS["eval_json"]).read_text()


@pytest.mark.slow
def test_api_candidate_and_judge_with_their_default_models_against_the_strict_server(data, fake_openai):
    """The `openai` candidate and the OpenAI judge with the shipped default model (gpt-5) against a server that
    enforces the API's GPT-5 rules: 0 failed calls. A candidate whose calls are all refused stops, exit 2, writing
    nothing."""
    fake_openai.script(replies={"<data>": '{"score": 5, "reason": "ok"}'})
    api = {"base_url": fake_openai.url, "api_key_env": "FAKE_KEY", "max_retries": 0, "backoff_base_s": 0.0}
    cfg = data.config
    cfg["reward"] = {"judge": {"provider": "openai", "openai": dict(api)}, "cache_dir": "cache/reward-gpt5"}
    cfg["eval"] = {"candidates": [{"name": "teacher", "kind": "teacher"}, {"name": "gpt5", "kind": "openai", "openai": api}],
                   "compare": [["gpt5", "teacher"]], "headline": ["teacher", "gpt5"], "judge_sample_share": 0.5,
                   "cache_dir": "cache/eval-gpt5"}
    (data.root / "c_gpt5.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    env = {"FAKE_KEY": "sk-test-not-a-real-key"}
    _, out = rewrites(data, "c_gpt5.yaml", "gpt5", env=env)
    rows = data.read_jsonl(out)
    assert rows and all(r["status"] == "ok" and r["model"] == "openai/gpt-5" for r in rows)
    files = [rewrites(data, "c_gpt5.yaml", "teacher", env=env)[1], out]
    run_eval(data, "c_gpt5.yaml", files, env=env)
    doc = json.loads((data.root / EVAL_PATHS["eval_json"]).read_text())
    assert doc["judge"]["model"] == "gpt-5" and doc["candidates"]["gpt5"]["errors"] == 0
    assert all(doc["candidates"][c]["judge_failures"] == 0 and doc["candidates"][c]["judge"]["mean"] == 5.0
               for c in ("teacher", "gpt5"))
    sent = [r for r in fake_openai.requests() if r["endpoint"] == "chat"]
    assert sent and {r["status"] for r in sent} == {200} and {r["model"] for r in sent} == {"gpt-5"}
    assert all("max_tokens" not in r["params"] and "temperature" not in r["params"] for r in sent)

    fake_openai.script(fail_first={"status": 400})  # every call refused: the judge's too
    cfg["eval"]["cache_dir"] = "cache/eval-refused"
    cfg["reward"]["cache_dir"] = "cache/reward-refused"
    (data.root / "c_refused.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    before = (data.root / EVAL_PATHS["eval_json"]).read_bytes()
    proc = run_eval(data, "c_refused.yaml", files, env=env, check=False)
    assert proc.returncode == 2 and "judge API" in proc.stderr and "refused all" in proc.stderr, proc.stderr[-2000:]
    assert (data.root / EVAL_PATHS["eval_json"]).read_bytes() == before
    (data.root / out).unlink()
    proc, _ = rewrites(data, "c_refused.yaml", "gpt5", env=env, check=False)
    assert proc.returncode == 2 and "refused all" in proc.stderr and "HTTP 400" in proc.stderr, proc.stderr[-2000:]
    assert not (data.root / out).exists()


def test_shared_prefix_len_leaves_each_prompt_a_token_of_its_own():
    from qrewrite.runtime.generate import shared_prefix_len

    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 9]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter one keeps its last token
    assert shared_prefix_len([[1, 2, 3]]) == 2
    assert shared_prefix_len([[7, 2], [1, 2]]) == 0
    assert shared_prefix_len([[1], [1, 2]]) == 0
    assert shared_prefix_len([]) == 0


@pytest.mark.slow
def test_eval_prompt_is_the_sft_prompt(data):
    """The messages a model candidate is prompted with are exactly the SFT sample's prompt messages."""
    from qrewrite.config import load_config, tenant_config
    from qrewrite.eval.candidates import eval_rows
    from qrewrite.prompts import rewrite_messages

    tenant = tenant_config(load_config(data.config_path), TENANT)
    rows = eval_rows(str(data.root / PATHS["test"]), str(data.root / PATHS["queries"]), None)
    for row, sample in zip(rows, data.read_jsonl(PATHS["test"])):
        assert rewrite_messages(tenant, row) == sample["messages"][:-1]


@pytest.mark.slow
def test_model_candidate_generates_with_transformers_in_the_swift_env(data, smollm2_base):
    """A real local model (the embedded SmolLM2 base) through `qrewrite eval-generate`, which re-runs itself in
    the ms-swift env: one row per query, latency per query, cost = GPU-hour price x generation time."""
    base = smollm2_base
    cfg = cfg_with_eval(data, "c_gen.yaml", candidates=[{"name": "base", "kind": "model", "path": str(base)}],
                        baseline="base", compare=[], headline=["base"], max_rows=3, gpu_hour_usd=3.6,
                        generation={"max_new_tokens": 12, "batch_size": 1}, without_sets=True)
    _, out = rewrites(data, cfg, "base", "--model", str(base), "--threads", "1")
    rows = data.read_jsonl(out)
    assert len(rows) == 3 and all(r["status"] == "ok" and r["model"] == str(base) for r in rows)
    assert all(0 < r["latency_s"] and r["compute_s"] == r["latency_s"] for r in rows)  # batch 1
    assert all(r["cost_usd"] == pytest.approx(3.6 * r["compute_s"] / 3600, rel=1e-6) for r in rows)
    assert all(1 <= r["usage"]["completion_tokens"] <= 12 for r in rows)
    assert rows[0]["generation"]["device"] == "cpu" and rows[0]["generation"]["batch_size"] == 1
    assert "<|im_end|>" not in "".join(r["rewrite"] for r in rows)

    # Batched: the 3 queries in batches of 2 share their batch's time (cost); only the first one, generated
    # again alone, carries a single-request latency.
    cfg = cfg_with_eval(data, "c_gen_batched.yaml", candidates=[{"name": "base", "kind": "model", "path": str(base)}],
                        baseline="base", compare=[], headline=["base"], max_rows=3, gpu_hour_usd=3.6,
                        generation={"max_new_tokens": 12, "batch_size": 2, "latency_sample": 1}, without_sets=True)
    _, out = rewrites(data, cfg, "base", "--model", str(base), "--threads", "1")
    batched = data.read_jsonl(out)
    assert [r["query_id"] for r in batched] == [r["query_id"] for r in rows]
    assert batched[0]["latency_s"] > 0 and batched[1]["latency_s"] is None and batched[2]["latency_s"] is None
    # batches are formed by prompt length: two queries share one batch's time, the third has its own
    assert sorted(Counter(r["compute_s"] for r in batched).values()) == [1, 2]
    assert batched[0]["generation"]["batch_size"] == 2 and batched[0]["generation"]["latency_sample"] == 1

    # The batches reused the keys and values of the prompts' shared start (the system turn); with the cache off
    # every batch computes its whole left-padded prompts, and the rewrites are the same.
    assert batched[0]["generation"]["cached_prefix_tokens"] > 10
    cfg = cfg_with_eval(data, "c_gen_uncached.yaml", candidates=[{"name": "base", "kind": "model", "path": str(base)}],
                        baseline="base", compare=[], headline=["base"], max_rows=3, gpu_hour_usd=3.6,
                        generation={"max_new_tokens": 12, "batch_size": 2, "latency_sample": 1,
                                    "prefix_cache": False}, without_sets=True)
    _, out = rewrites(data, cfg, "base", "--model", str(base), "--threads", "1")
    uncached = data.read_jsonl(out)
    assert uncached[0]["generation"]["cached_prefix_tokens"] == 0
    assert [r["raw_completion"] for r in uncached] == [r["raw_completion"] for r in batched]

    # eval.generation.dtype: the weights load in it (float32 on cpu by default), and its rows say so
    assert batched[0]["generation"]["dtype"] == "torch.float32"
    cfg = cfg_with_eval(data, "c_gen_bf16.yaml", candidates=[{"name": "base", "kind": "model", "path": str(base)}],
                        baseline="base", compare=[], headline=["base"], max_rows=3, gpu_hour_usd=3.6,
                        generation={"max_new_tokens": 12, "batch_size": 2, "latency_sample": 0,
                                    "dtype": "bfloat16"}, without_sets=True)
    _, out = rewrites(data, cfg, "base", "--model", str(base), "--threads", "1")
    bf16 = data.read_jsonl(out)
    assert len(bf16) == 3 and all(r["status"] == "ok" for r in bf16)
    assert bf16[0]["generation"]["dtype"] == "torch.bfloat16"


def test_generation_kwargs_pass_each_decoding_key_of_the_config_to_generate_rewrites():
    """The one list the eval, the release, the rl check, the GPU check and the bench take their decoding from:
    each key is a setting of eval.generation (schema) and a keyword of generate_rewrites; an override replaces."""
    import inspect

    from qrewrite.config import load_config
    from qrewrite.runtime.generate import DECODING_KEYS, generate_rewrites, generation_kwargs
    from conftest import REPO

    gen = load_config(REPO / "config.yaml")["eval"]["generation"]
    params = inspect.signature(generate_rewrites).parameters
    assert set(DECODING_KEYS) <= set(gen) and set(DECODING_KEYS) <= set(params)
    kw = generation_kwargs(gen, copy_bias=None, device="cpu")
    assert kw["copy_bias"] is None and kw["device"] == "cpu" and kw["batch_size"] == gen["batch_size"]
    assert set(kw) <= set(params)


def test_auto_dtype_is_bfloat16_only_where_it_runs_natively():
    from qrewrite.hardware import cpu_has_bf16, resolve_dtype

    assert resolve_dtype("auto", "cuda", has_bf16=False) == "bfloat16"
    assert resolve_dtype("auto", "cpu", has_bf16=True) == "bfloat16"
    assert resolve_dtype("auto", "cpu", has_bf16=False) == "float32"  # emulated bf16 is slower than float32
    assert resolve_dtype("auto", "cpu") == ("bfloat16" if cpu_has_bf16() else "float32")  # this machine's own flags
    # explicit settings and null keep their meaning
    assert [resolve_dtype(d, "cpu", has_bf16=False) for d in ("bfloat16", "float32", None)] == ["bfloat16", "float32", "float32"]
    assert resolve_dtype(None, "cuda") == "bfloat16"
