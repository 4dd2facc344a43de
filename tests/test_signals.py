"""Faithful signals: tie-aware ranking, a retrieval score that agrees with gold, a judge measured on labelled
sets, the embedded resolve teacher, and the pipeline writing those figures where a user reads them."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import REPO, Project
from qrewrite.entities import EntityLexicon
from qrewrite.kb import Doc, load_kb
from qrewrite.metrics import gold_ranking
from qrewrite.rag.local import LocalRetriever
from qrewrite.rag.providers import LocalRag
from qrewrite.reward.judge_rules import RuleJudge
from qrewrite.reward.verdict import Verdict
from qrewrite.data.ingest import query_id
from qrewrite.reward.check import judge_section
from qrewrite.signals import auc, judge_auc, load_judge_labels, score_agreement
from qrewrite.teacher.prf import PrfTeacher
from qrewrite.teacher.resolve import ResolveTeacher

TENANTS = ("fivedoctors", "chengla")
PRF = dict(fb_docs=1, fb_terms=4, original_weight=0.6, history_weight=0.5, profile_weight=0.1, max_term_df=0.2)


def demo_queries(tenant: str) -> list[dict]:
    rows = [json.loads(line) for line in (REPO / "data/demo" / f"{tenant}.queries.jsonl").read_text("utf-8").splitlines()]
    return [{**r, "id": f"q{i}"} for i, r in enumerate(rows)]


def kb(tenant: str) -> list[Doc]:
    return load_kb(REPO / "data/kb" / f"{tenant}.jsonl")


# ------------------------------------------------------------------------------------------------- ties

def tie_kb(gold_first: bool) -> list[Doc]:
    gold = Doc("gold", "鱼油用法", "深海鱼油每天吃两粒")
    twin = Doc("twin", "鱼油用法", "深海鱼油每天吃两粒")      # same text: exactly the same BM25 score
    rest = [Doc(f"d{i}", f"其他{i}", f"叶酸片第{i}条说明") for i in range(6)]
    return ([gold, twin] if gold_first else [twin, gold]) + rest


@pytest.mark.parametrize("score", ["relevance", "coverage"])
def test_hit_at_1_of_a_tie_does_not_depend_on_kb_file_order(score):
    results = []
    for gold_first in (True, False):
        r = LocalRetriever(tie_kb(gold_first), "zh", score=score)
        hits = r.search("鱼油每天吃几粒", 5)
        results.append(gold_ranking(hits, ["gold"]))
    assert results[0] == results[1]
    assert results[0]["hit_at_1"] == 0.5 and results[0]["rr"] == 0.75 and results[0]["gold_tied"] == 2


def test_gold_ranking_expectations():
    def hits(*scores):
        return [{"doc_id": d, "reranker_score": s} for d, s in zip("abcdefgh", scores)]
    # gold alone on top; tied in a group of 3 below one better document; two golds in a group of 4
    assert gold_ranking(hits(0.9, 0.5, 0.1), ["a"])["hit_at_1"] == 1.0
    r = gold_ranking(hits(0.9, 0.5, 0.5, 0.5), ["c"])
    assert (r["hit_at_1"], r["gold_rank"]) == (0.0, 4) and r["rr"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    r = gold_ranking(hits(0.5, 0.5, 0.5, 0.5), ["a", "d"])
    assert r["hit_at_1"] == pytest.approx(0.5)           # P(a gold first) = 2/4
    assert r["rr"] == pytest.approx(1 * 3 / 6 + 1 / 2 * 2 / 6 + 1 / 3 * 1 / 6)
    # gold straddling the Hit@5 cut-off: positions 4..7 of which 2 are <= 5
    assert gold_ranking(hits(0.9, 0.8, 0.7, 0.1, 0.1, 0.1, 0.1), ["e"])["hit_at_5"] == pytest.approx(0.5)
    assert gold_ranking(hits(0.9), ["z"]) == {"hit_at_1": 0.0, "hit_at_5": 0.0, "rr": 0.0, "gold_rank": None,
                                              "gold_tied": 0}


def test_local_hits_carry_the_whole_tie_group_at_the_cut_off():
    r = LocalRetriever(tie_kb(True), "zh")
    hits = r.search("鱼油每天吃几粒", 1)
    assert {h["doc_id"] for h in hits} == {"gold", "twin"}   # top_k 1, but both tied documents


# ------------------------------------------------------------------------------------- retrieval score

def test_relevance_score_is_low_when_a_query_matches_many_documents_equally():
    r = LocalRetriever(kb("fivedoctors"), "zh")
    vague = r.search("这个怎么吃", 5)[0]["reranker_score"]          # every product's dosage page alike
    pinned = r.search("深海鱼油软胶囊每天吃几粒", 5)
    assert vague < 0.05 and pinned[0]["doc_id"] == "fd-002" and pinned[0]["reranker_score"] > 0.5
    # a pasted distractor history pins down a document the question never asked about: the coverage of
    # the user's question keeps its score below the resolved question's
    q = "乳青蛋白要不要放冰箱"
    pasted = r.search(f"{q} 用户此前咨询过物流发货时间", 5, question=q)
    resolved = r.search("乳清蛋白粉要不要放冰箱", 5, question=q)
    assert resolved[0]["doc_id"] == "fd-032" and pasted[0]["reranker_score"] < resolved[0]["reranker_score"]


@pytest.mark.parametrize("tenant", TENANTS)
def test_relevance_score_agrees_with_gold_on_the_demo(tenant):
    """The issue's bar: >= 85 % of pairs; the seed's coverage score sits far below it (the before figure)."""
    queries = demo_queries(tenant)
    docs = kb(tenant)
    lexicon = EntityLexicon.from_docs(docs)
    teacher = ResolveTeacher(lexicon)
    rewrites = {q["id"]: teacher.rewrite(q["query"], q["profile"], q["history"]) for q in queries}

    def agreement(score, quality):
        rag = LocalRag(LocalRetriever(docs, "zh", score=score), top_k=5, score_threshold=0.0)
        return asyncio.run(score_agreement(rag, queries, rewrites, lexicon, quality))

    new = agreement("relevance", "top1")
    old = agreement("coverage", "seed")
    assert new["pairs"] >= 150 and new["agreement"] >= 0.85
    assert old["agreement"] < 0.7
    assert set(new["texts"]) == {"raw", "teacher", "query_history", "referent_filled"}


# ------------------------------------------------------------------------------------------------ judge

def teacher_rewrites(tenant: str) -> dict[str, str]:
    """What the embedded teacher writes for every demo query (teacher.jsonl's rewrites), by query id."""
    docs = kb(tenant)
    teacher = ResolveTeacher(EntityLexicon.from_docs(docs))
    return {query_id(q["query"], q["profile"], q["history"]): teacher.rewrite(q["query"], q["profile"], q["history"])
            for q in demo_queries(tenant)}


@pytest.mark.parametrize("tenant", TENANTS)
def test_rule_judge_auc_on_the_labelled_sets(tenant):
    """Each labelled rewrite judged against the teacher's rewrite of its question, as RL and eval judge; the
    held-out half (by a hash of the question) is what no rule of rules-v3 was tuned on."""
    path = str(REPO / "data/demo" / f"{tenant}.judge_labels.jsonl")
    rows = load_judge_labels(path)
    assert len(rows) >= 60 and {r["label"] for r in rows} == {"good", "bad"}
    assert {"missing_referent", "wrong_referent", "aspect_changed", "answers", "asks_back", "keyword_bag",
            "too_long"} <= {r["failure"] for r in rows if r["label"] == "bad"}
    res = asyncio.run(judge_section(RuleJudge("zh", kb(tenant)), [], path, teacher_rewrites(tenant)))["labelled"]
    assert res["no_reference"] <= 0.1 * len(rows)      # labelled questions that are not in the tenant's data
    assert res["heldout"]["auc"] >= 0.9 and res["heldout"]["n_good"] >= 20 and res["heldout"]["n_bad"] >= 20
    assert res["all"]["auc"] >= 0.9
    assert all(f["auc"] >= 0.85 for f in res["all"]["by_failure"].values()), res["all"]["by_failure"]


def test_auc_is_a_half_for_a_constant_judge_and_labels_are_checked(tmp_path):
    class Constant:  # TEST FAKE: the old embedded judge's failure mode, one score for everything
        async def judge(self, *a):
            return Verdict(4.0, "constant")

    rows = load_judge_labels(str(REPO / "data/demo/chengla.judge_labels.jsonl"))
    assert asyncio.run(judge_auc(Constant(), rows))["auc"] == 0.5
    assert auc([5, 4], [1, 2]) == 1.0 and auc([1], [5]) == 0.0 and auc([], [1]) is None
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"query": "q", "rewrite": "r", "label": "fine"}\n', encoding="utf-8")
    from qrewrite.errors import QrewriteError
    with pytest.raises(QrewriteError, match="label 'fine' is not good or bad"):
        load_judge_labels(str(bad))


def test_rule_judge_scores_spread_over_raw_teacher_and_pasted_history():
    queries = [q for q in demo_queries("fivedoctors") if q["underspecified"]][:40]
    docs = kb("fivedoctors")
    judge, teacher = RuleJudge("zh", docs), ResolveTeacher(EntityLexicon.from_docs(docs))
    refs = [teacher.rewrite(q["query"], q["profile"], q["history"]) for q in queries]

    def mean(texts):
        return sum(judge.score(q["query"], q["profile"], q["history"], t, r).score
                   for q, t, r in zip(queries, texts, refs)) / len(queries)

    raw = mean([q["query"] for q in queries])
    pasted = mean([f"{q['query']} {q['history']}" for q in queries])
    assert mean(refs) == 5.0 and raw < 2.5 and pasted < 3.5


# ---------------------------------------------------------------------------------------------- teacher

def test_entity_lexicon_reads_entities_off_kb_titles_and_finds_loose_mentions():
    lex = EntityLexicon.from_docs(kb("chengla"))
    assert "考研政治冲刺班" in lex.entities and "少儿编程Python启蒙课" in lex.entities
    assert lex.doc_entity["cl-006"] == "考研英语全程班" and lex.doc_aspect["cl-006"] == "适合人群与基础要求"
    assert lex.doc_entity["cl-075"] is None                    # 转班与延期规则: tenant-wide
    for text, entity in (("小学澳数能不能退钱啊", "小学奥数思维课"), ("初级会几是直播还是录播", "初级会计职称班"),
                         ("用户刚下单了行测", "公务员行测系统班"), ("少儿编城是直播还是录播", "少儿编程Python启蒙课")):
        assert [m.entity for m in lex.mentions(text)] == [entity], text
    assert lex.mentions("英语怎么学") == []                     # two English courses: ambiguous, no guess
    assert lex.ambiguous_spans("英语怎么学") == [{"考研英语全程班", "大学英语四六级通关班"}]
    # ... which the conversation settles: the teacher writes the one the profile names over "英语"
    assert ResolveTeacher(lex).rewrite("英语老师有多少年经验", "已报名考研英语全程班", "") == "考研英语全程班老师有多少年经验"
    assert lex.mentions("资料会寄过来吗") == []                  # one character and a homophone: chance
    assert lex.last_mentioned("用户对比了小学奥数思维课和申论写作精品班，最后选了小学奥数思维课") == "小学奥数思维课"


@pytest.mark.parametrize("tenant,prf_before", [("fivedoctors", 0.704), ("chengla", 0.838)])
def test_resolve_teacher_retrieves_at_least_as_well_as_prf(tenant, prf_before):
    """Tie-aware gold Hit@1 over every demo row, through the default retrieval score."""
    queries = demo_queries(tenant)
    docs = kb(tenant)
    resolve = ResolveTeacher(EntityLexicon.from_docs(docs))
    prf = PrfTeacher(LocalRetriever(docs, "zh"), PRF)
    r = LocalRetriever(docs, "zh")

    def hit1(teacher):
        got = [gold_ranking(r.search(teacher.rewrite(q["query"], q["profile"], q["history"]), 5, question=q["query"]),
                            q["gold_doc_ids"])["hit_at_1"] for q in queries if q["gold_doc_ids"]]
        return sum(got) / len(got)

    assert hit1(resolve) >= max(prf_before, hit1(prf))


# ----------------------------------------------------------------------------------------- the pipeline

@pytest.mark.slow
def test_validation_writes_the_agreement_figure_into_the_summary(tmp_path):
    project = Project(tmp_path / "proj")
    project.keep_queries("chengla", 80)
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check", "summarize"):
        project.stage(stage, tenant="chengla")
    summary = json.loads((project.root / "results/chengla/summary.json").read_text(encoding="utf-8"))
    rc = summary["signals"]["reward_check"]     # the judge and the reward on labels derived from the data
    assert rc["judge_auc_derived"] >= 0.85 and min(rc["judge_auc_derived_by_kind"].values()) >= 0.8, rc
    assert rc["judge_auc_labelled_heldout"] >= 0.9 and rc["reward_preference"] >= 0.85 and rc["refusal"] is None
    sa = summary["signals"]["score_agreement"]
    assert sa["score"] == "relevance" and sa["quality"] == "top1" and sa["agreement"] >= 0.85
    assert sa["alternatives"]["coverage/seed"]["agreement"] < sa["agreement"]
    hit = summary["retrieval"]["hit_at_1"]
    assert "random tie-breaking" in hit["tie_rule"] and hit["rewrite"] > hit["original"]


@pytest.mark.slow
def test_rl_refuses_a_judge_that_fails_its_check_on_the_tenant(tmp_path, fake_openai):
    """An LLM judge that gives every rewrite 4 (AUC 0.5 on the derived labels): `qrewrite rl` stops before training,
    naming the figure, the tenant and the fix; with reward.weights.judge 0 the same judge is no reason to stop."""
    project = Project(tmp_path / "proj")
    project.keep_queries("fivedoctors", 60)
    fake_openai.script(default_reply='{"score": 4, "reason": "fine"}')
    judge = {"provider": "openai", "sample_share": 1.0,
             "openai": {"base_url": fake_openai.url, "model": "test-judge", "api_key_env": "QR_TEST_KEY"}}
    project.update(reward={"judge": judge})
    env = {"QR_TEST_KEY": "sk-test-not-a-real-key"}
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check"):
        project.stage(stage, env=env)
    check = json.loads((project.root / "results/fivedoctors/reward_check.json").read_text(encoding="utf-8"))
    assert check["judge"]["derived"]["auc"] == 0.5
    assert "judge_min_auc" in check["refusal"] and "fivedoctors" in check["refusal"]
    proc = project.qrewrite("rl", "--config", "config.yaml", "--tenant", "fivedoctors", "--model", "models/none",
                            "--data-dir", "results/fivedoctors/rl", "--reward-check",
                            "results/fivedoctors/reward_check.json", "--out", "models/fivedoctors/rl", "--run-dir",
                            "results/fivedoctors/train/rl-run", "--tb", "logs/tb", env=env, check=False)
    assert proc.returncode == 2
    assert "refusing to train" in proc.stderr and "0.5" in proc.stderr and "reward.weights.judge: 0" in proc.stderr
    assert not (project.root / "models/fivedoctors/rl").exists()
    project.update(reward={"judge": judge, "weights": {"judge": 0.0, "retrieval": 0.4, "win": 0.25,
                                                       "rank": 0.35}})
    project.stage("reward-check", env=env)
    check = json.loads((project.root / "results/fivedoctors/reward_check.json").read_text(encoding="utf-8"))
    assert check["judge"]["derived"]["auc"] == 0.5 and check["refusal"] is None
    assert check["reward"]["preference"] >= 0.85


def test_refusal_names_the_failing_figure_and_lets_a_user_who_lowers_the_floors_train():
    from qrewrite.reward import reward_settings
    from qrewrite.reward.check import refusal

    def doc(good, auc, pref):
        return {"tenant": "t", "derived_labels": {"good": good}, "judge": {"derived": {"auc": auc}},
                "reward": {"preference": pref}}

    s = reward_settings({})
    assert refusal(doc(50, 0.95, 0.9), s) is None
    assert "judge_min_auc 0.75" in refusal(doc(50, 0.6, 0.9), s)
    assert "min_preference 0.75" in refusal(doc(50, 0.95, 0.5), s)
    assert "no derived labels" in refusal(doc(0, None, None), s)
    open_ = reward_settings({"reward": {"check": {"judge_min_auc": 0.0, "min_preference": 0.0}}})
    assert refusal(doc(0, None, None), open_) is None and refusal(doc(50, 0.5, 0.2), open_) is None
    no_judge = reward_settings({"reward": {"weights": {"judge": 0.0}}})
    assert refusal(doc(50, 0.5, 0.9), no_judge) is None
