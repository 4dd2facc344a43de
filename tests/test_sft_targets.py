"""SFT targets chosen by retrieval (qrewrite.training.sft.targets, the sft_targets stage): per training and validation
row, the teacher's rewrite, it + the history terms it dropped, or it + the history, whichever puts gold first with
the widest margin, through the real local BM25 retriever over a small KB of chit-chat utterances."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml

from qrewrite.cli import main
from qrewrite.io_utils import read_jsonl
from qrewrite.kb import Doc
from qrewrite.metrics import gold_ranking
from qrewrite.rag.local import LocalRetriever
from qrewrite.rag.providers import LocalRag
from qrewrite.training.sft.targets import (TARGETS, _choose_rows, choose, gold_margin, retarget, target_texts,
                                       with_dropped_terms)

REPO = Path(__file__).resolve().parents[1]
KB = [Doc("d1", "", "小林家的龙女仆是动漫"), Doc("d2", "", "海贼王是动漫"), Doc("d3", "", "龙女仆好看吗"),
      Doc("d4", "", "正气歌是文天祥写的"), Doc("d5", "", "你喜欢吃苹果吗"), Doc("d6", "", "今天天气很好"),
      Doc("d7", "", "是动漫吗")]
ROWS = {
    # the teacher's rewrite is the gold utterance itself: nothing widens its lead
    "q1": {"query_id": "q1", "query": "是谁写的", "history": "正气歌 / 背诵一下", "gold_doc_ids": ["d4"]},
    # the teacher named the referent short ("龙女仆"): gold first, narrowly; the history's full title widens the lead
    "q2": {"query_id": "q2", "query": "是动漫", "history": "小林家的龙女仆 / 你看过吗", "gold_doc_ids": ["d1"]},
    # no gold: the teacher's rewrite stays, no retrieval
    "q3": {"query_id": "q3", "query": "喜欢吗", "history": "苹果 / 你吃吗", "gold_doc_ids": []},
}
TEACHER = {"q1": "正气歌是文天祥写的", "q2": "龙女仆是动漫", "q3": "喜欢吃苹果吗"}


def sample(qid: str) -> dict:
    return {"messages": [{"role": "system", "content": "改写"}, {"role": "user", "content": ROWS[qid]["query"]},
                         {"role": "assistant", "content": TEACHER[qid]}], "meta": {"query_id": qid}}


def rag() -> LocalRag:
    return LocalRag(LocalRetriever(KB, "zh"), top_k=5, score_threshold=0.0)


def test_gold_margin_is_golds_lead_over_the_best_other_document_relative_to_the_top():
    hits = [{"doc_id": "a", "reranker_score": 0.8}, {"doc_id": "g", "reranker_score": 0.6},
            {"doc_id": "b", "reranker_score": 0.2}]
    assert gold_margin(hits, ["g"]) == (0.6 - 0.8) / 0.8
    assert gold_margin(hits, ["a"]) == (0.8 - 0.6) / 0.8
    assert gold_margin([{"doc_id": "g", "reranker_score": 0.5}], ["g"]) == 1.0  # gold alone
    assert gold_margin(hits, ["x"]) == -1.0  # gold not retrieved
    assert gold_margin([], ["g"]) == 0.0


def test_the_best_hit_then_the_widest_margin_wins_and_a_tie_keeps_the_cheaper():
    assert choose({"teacher": (1.0, 0.5), "teacher+dropped_terms": (1.0, 0.5), "teacher+history": (1.0, 0.5)}) \
        == "teacher"
    assert choose({"teacher": (1.0, 0.5), "teacher+dropped_terms": (1.0, 0.7), "teacher+history": (1.0, 0.9)}) \
        == "teacher+history"
    # Hit@1 first: a wide margin does not buy back a missed gold
    assert choose({"teacher": (1.0, 0.1), "teacher+dropped_terms": (0.5, 0.9), "teacher+history": (0.0, -0.2)}) \
        == "teacher"


def test_dropped_terms_are_the_historys_terms_the_rewrite_and_question_lack():
    row = {"query": "是动漫", "history": "小林家的龙女仆 / 你看过吗"}
    out = with_dropped_terms("龙女仆是动漫", row, "zh")
    assert out.startswith("龙女仆是动漫 ") and "小林" in out and "龙女仆 " not in out[len("龙女仆是动漫 "):]
    assert set(target_texts("龙女仆是动漫", row, "zh")) == set(TARGETS)
    assert target_texts("龙女仆是动漫", row, "zh")["teacher+history"] == "龙女仆是动漫 小林家的龙女仆 / 你看过吗"


def test_each_row_gets_the_target_that_retrieves_gold_most_surely():
    r = rag()
    samples = [sample(q) for q in ROWS]
    picks = asyncio.run(_choose_rows(r, samples, ROWS, "zh"))
    assert r.calls == 3 * 2  # three texts for each row with gold; none for the row without
    for s, p in zip(samples, picks):
        row = ROWS[s["meta"]["query_id"]]
        if not row["gold_doc_ids"]:
            assert p == {"target": "teacher", "scores": None}
            continue
        texts = target_texts(s["messages"][-1]["content"], row, "zh")
        scores = {}
        for t in TARGETS:
            hits = asyncio.run(r.search(row["query"], texts[t]))
            scores[t] = [gold_ranking(hits, row["gold_doc_ids"])["hit_at_1"],
                         round(gold_margin(hits, row["gold_doc_ids"]), 4)]
        assert p["scores"] == scores
        assert p["target"] == choose({t: tuple(v) for t, v in scores.items()}) and p["text"] == texts[p["target"]]
    assert [p["target"] for p in picks] == ["teacher", "teacher+history", "teacher"]
    out = retarget(samples, picks)
    assert out[1]["messages"][-1]["content"] == "龙女仆是动漫 小林家的龙女仆 / 你看过吗"
    assert [o["messages"][-1]["content"] for o in (out[0], out[2])] == [TEACHER["q1"], TEACHER["q3"]]
    assert [o["meta"]["target"] for o in out] == ["teacher", "teacher+history", "teacher"]
    assert samples[1]["messages"][-1]["content"] == TEACHER["q2"]  # the input is left as it was


def _project(tmp_path: Path, targets: str, tenant_targets: str | None = None) -> Path:
    kb = tmp_path / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": d.doc_id, "text": d.content}, ensure_ascii=False) + "\n" for d in KB),
                  encoding="utf-8")
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": q, "row": n, "query": r["query"], "profile": "",
                                           "history": r["history"], "gold_doc_ids": r["gold_doc_ids"]},
                                          ensure_ascii=False) + "\n" for n, (q, r) in enumerate(ROWS.items(), 2)), encoding="utf-8")
    for split, qids in (("train", ["q1", "q2"]), ("val", ["q3"])):
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps(sample(q), ensure_ascii=False) + "\n" for q in qids), encoding="utf-8")
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    tenant = dict(cfg["tenants"][0])
    tenant.update(name="chat", language="zh", kb={"path": str(kb), "name": "chat_kb",
                                                   "fields": {"doc_id": "id", "title": None, "content": "text"}})
    if tenant_targets:
        tenant["sft_targets"] = tenant_targets
    cfg["tenants"] = [tenant]
    cfg["train"]["sft"]["targets"] = targets
    path = tmp_path / f"config-{targets}-{tenant_targets}.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


def _run(tmp_path: Path, config: Path, tag: str) -> dict:
    out = tmp_path / tag
    assert main(["sft-targets", "--config", str(config), "--tenant", "chat", "--train", str(tmp_path / "train.jsonl"),
                 "--val", str(tmp_path / "val.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
                 "--out-train", str(out / "train.jsonl"), "--out-val", str(out / "val.jsonl"),
                 "--stats", str(out / "stats.json")]) == 0
    return {"train": list(read_jsonl(out / "train.jsonl")), "val": list(read_jsonl(out / "val.jsonl")),
            "stats": json.loads((out / "stats.json").read_text(encoding="utf-8"))}


def test_the_stage_copies_the_teachers_rows_or_writes_the_retrieval_chosen_ones(tmp_path):
    teacher = _run(tmp_path, _project(tmp_path, "teacher"), "teacher")
    assert teacher["train"] == list(read_jsonl(tmp_path / "train.jsonl"))
    assert teacher["val"] == list(read_jsonl(tmp_path / "val.jsonl"))
    assert teacher["stats"]["splits"] == {"train": {"rows": 2, "chosen": {"teacher": 2}},
                                          "val": {"rows": 1, "chosen": {"teacher": 1}}}
    chosen = _run(tmp_path, _project(tmp_path, "retrieval"), "retrieval")
    assert [s["messages"][-1]["content"] for s in chosen["train"]] == [TEACHER["q1"], "龙女仆是动漫 小林家的龙女仆 / 你看过吗"]
    assert [s["meta"]["target"] for s in chosen["train"]] == ["teacher", "teacher+history"]
    assert chosen["val"][0]["messages"][-1]["content"] == TEACHER["q3"]
    assert chosen["stats"]["targets"] == "retrieval"
    assert chosen["stats"]["splits"]["train"]["chosen"] == {"teacher": 1, "teacher+history": 1}


def test_a_tenants_own_setting_overrides_the_global_one_and_reruns_that_tenant_only(tmp_path):
    from qrewrite.config import load_config
    from qrewrite.workflow.stages import param_value

    own = _run(tmp_path, _project(tmp_path, "teacher", tenant_targets="retrieval"), "own")
    assert own["stats"]["targets"] == "retrieval"
    assert [s["meta"]["target"] for s in own["train"]] == ["teacher", "teacher+history"]
    cfg = load_config(_project(tmp_path, "teacher", tenant_targets="retrieval"))
    other = {**cfg["tenants"][0], "name": "other", "sft_targets": None}
    assert param_value(cfg, "train.sft.targets", cfg["tenants"][0]) == "retrieval"
    assert param_value(cfg, "train.sft.targets", other) == "teacher"


def test_history_mode_pastes_the_history_after_every_rows_rewrite_gold_or_not(tmp_path):
    # one rule for the tenant: the row without gold (val's q3) gets it too, and no retrieval is needed to say so
    hist = _run(tmp_path, _project(tmp_path, "history"), "history")
    assert [s["messages"][-1]["content"] for s in hist["train"]] == ["正气歌是文天祥写的 正气歌 / 背诵一下",
                                                                    "龙女仆是动漫 小林家的龙女仆 / 你看过吗"]
    assert hist["val"][0]["messages"][-1]["content"] == "喜欢吃苹果吗 苹果 / 你吃吗"
    assert [s["messages"][:-1] for s in hist["train"]] == [s["messages"][:-1] for s in read_jsonl(tmp_path / "train.jsonl")]
    assert hist["stats"]["targets"] == "history"
    assert hist["stats"]["splits"] == {"train": {"rows": 2, "chosen": {"teacher+history": 2}},
                                       "val": {"rows": 1, "chosen": {"teacher+history": 1}}}
