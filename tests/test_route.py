"""route_by_retrieval (qrewrite.runtime.route): per row, the text whose top hit the tenant's RAG scores highest, through
the real local BM25 retriever over a small KB of chit-chat utterances (no gold is read to route)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qrewrite.config import load_config, validate_config
from qrewrite.errors import QrewriteError
from qrewrite.runtime.route import PARTS, choose, client_rows, part_texts, route_rows
from qrewrite.kb import Doc
from qrewrite.rag.local import LocalRetriever
from qrewrite.rag.providers import LocalRag

REPO = Path(__file__).resolve().parents[1]
KB = [Doc("d1", "", "小林家的龙女仆是动漫"), Doc("d2", "", "海贼王是动漫"), Doc("d3", "", "火影忍者是谁画的"),
      Doc("d4", "", "正气歌是文天祥写的"), Doc("d5", "", "你喜欢吃苹果吗"), Doc("d6", "", "今天天气很好"),
      Doc("d7", "", "给我背诵一下正气歌")]  # the history of q2 matches it: pasted, the history blurs the rewrite
ROWS = [
    # the student took the referent from the wrong turn: its text names something no utterance pairs with 动漫
    {"query_id": "q1", "query": "是动漫", "history": "小林家的龙女仆 / 你看过吗"},
    # the student's rewrite is the utterance itself
    {"query_id": "q2", "query": "是谁写的", "history": "正气歌 / 背诵一下"},
    # an empty generation
    {"query_id": "q3", "query": "喜欢吗", "history": "苹果 / 你吃吗"},
]
OWN = ["你看过是动漫", "正气歌是文天祥写的", ""]


def rag() -> LocalRag:
    return LocalRag(LocalRetriever(KB, "zh"), top_k=5, score_threshold=0.0)


def top1(r: LocalRag, row: dict, text: str) -> float:
    hits = asyncio.run(r.search(row["query"], text)) if text else []
    return max((h["reranker_score"] for h in hits), default=0.0)


def test_each_row_goes_to_the_text_whose_top_hit_scores_highest():
    r = rag()
    got = asyncio.run(route_rows(r, ROWS, OWN))
    assert r.calls == 3 * len(ROWS) - 1  # three retrievals a row; an empty text is not sent
    for row, own, g in zip(ROWS, OWN, got):
        texts = part_texts(own, row)
        tops = {p: round(top1(r, row, texts[p]), 6) for p in PARTS}
        assert g["route_top1"] == tops
        assert g["routed_to"] == max(PARTS, key=lambda p: (tops[p], -PARTS.index(p)))
        assert g["rewrite"] == texts[g["routed_to"]]
    # the wrong referent loses to the text with the right one (own + history ties query + history: the cheaper);
    # the exact utterance is kept as it is; an empty rewrite retrieves nothing
    assert [g["routed_to"] for g in got] == ["own+history", "own", "query_history"]
    assert got[2]["route_top1"]["own"] == 0.0


def test_equal_top_scores_keep_the_cheaper_text():
    assert choose({"own": 0.5, "own+history": 0.5, "query_history": 0.5}) == "own"
    assert choose({"own": 0.1, "own+history": 0.5, "query_history": 0.5}) == "own+history"
    assert choose({"own": 0.1, "own+history": 0.2, "query_history": 0.5}) == "query_history"


def test_client_rows_send_the_own_text_the_history_or_the_routed_text(tmp_path):
    kb = tmp_path / "kb.jsonl"
    kb.write_text("".join(f'{{"id": "{d.doc_id}", "content": "{d.content}"}}\n' for d in KB), encoding="utf-8")
    cfg = {"rag": {"provider": "local", "top_k": 5, "score_threshold": 0.0, "local": {"k1": 1.5, "b": 0.75}}}
    tenant = {"language": "zh", "kb": {"path": str(kb), "fields": {"doc_id": "id", "title": None, "content": "content"}}}
    # an empty rewrite is never sent, under any decoding: query + history is, marked
    empty = {"rewrite": "喜欢吗 苹果 / 你吃吗", "model_rewrite": "", "fallback": "empty"}
    assert client_rows({}, cfg, tenant, ROWS, OWN) == [{"rewrite": o} for o in OWN[:2]] + [empty]
    appended = client_rows({"append_history": True}, cfg, tenant, ROWS, OWN)
    assert appended[0] == {"rewrite": "你看过是动漫 小林家的龙女仆 / 你看过吗", "model_rewrite": OWN[0]}
    assert appended[2] == empty
    routed = client_rows({"route_by_retrieval": True}, cfg, tenant, ROWS, OWN)
    assert [x["model_rewrite"] for x in routed] == OWN
    assert [{k: x[k] for k in ("rewrite", "routed_to", "route_top1")} for x in routed[:2]] == \
        asyncio.run(route_rows(rag(), ROWS[:2], OWN[:2]))
    assert routed[2] == {**empty, "routed_to": "query_history"}


class DownRag:
    """A RAG provider whose every search fails, as HttpRag does when the service is down."""

    async def search(self, query, rewritten_query=None):
        from qrewrite.errors import ServiceUnavailable

        raise ServiceUnavailable("RAG service down")


def test_a_rag_that_fails_while_routing_stops_a_stage_and_the_gateway_sends_the_own_text():
    from qrewrite.errors import ServiceUnavailable
    from qrewrite.runtime.route import sent_one

    row, own = ROWS[0], OWN[0]
    with pytest.raises(ServiceUnavailable):  # a pipeline stage: no figure from a silent fallback
        asyncio.run(sent_one({"route_by_retrieval": True}, DownRag(), row, own))
    got = asyncio.run(sent_one({"route_by_retrieval": True}, DownRag(), row, own, on_rag_error="own"))
    assert got == {"rewrite": own, "model_rewrite": own, "routed_to": "own", "fallback": "rag_unavailable"}


def test_a_lever_that_both_appends_and_routes_is_refused():
    cfg = load_config(REPO / "config.yaml")
    cfg["release"]["decoding"] = [{}, {"append_history": True, "route_by_retrieval": True}]
    with pytest.raises(QrewriteError, match=r"release.decoding\[1\]: append_history and route_by_retrieval"):
        validate_config(cfg)
