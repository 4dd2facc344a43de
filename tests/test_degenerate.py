"""What counts as a degenerate rewrite (qrewrite.eval.degenerate), and its fallback."""

from __future__ import annotations

import pytest

from qrewrite.eval.degenerate import REASONS, degeneracy, fallback, has_loop, source_text, summarize


@pytest.mark.parametrize("rewrite, source, finished, want", [
    ("乳清蛋白粉粉粉粉粉粉粉粉", "乳清蛋白粉怎么吃", True, "loop"),                  # seen on fivedoctors (SFT)
    ("复合维生素B片复合维生素C片复合维生素D片", "维生素怎么吃", True, "loop"),      # seen on fivedoctors (RL)
    ("奶蓟草护肝片什么时候吃效果好", "奶蓟草护肝片啥时候吃效果好", True, None),
    ("", "x", True, "empty"), ("。。 ", "x", True, "empty"),
    ("奶蓟草护肝片什么时候吃效果最好呢", "护肝片啥时候吃", False, "unfinished"),     # cut, longer than its source
    ("Please pick the fastest route to get to the gas station Valero 7 miles", "valero? " * 3 +
     "I need gas, the Valero station 7 miles away, fastest route please", False, None),  # a long rewrite, cut
    ("I want Safeway 1 mile away at a grocery store Safeway 1 mile away at", "grocery store? safeway 1 mile",
     False, "loop"),                                                                  # cut inside a repeat
    ("奶蓟草护肝片什么时候吃", "奶蓟草护肝片啥时候吃", None, None),                # unknown: not judged on it
    ("what is the address of the nearest gas station", "where is the nearest gas station, its address", True, None),
    ("the hotel the guest asked about in the booking the day before the long trip", "the hotel?",
     True, "overlong"),
    ("哈哈哈", "哈哈哈", True, None),
])
def test_degeneracy(rewrite, source, finished, want):
    assert degeneracy(rewrite, source=source, finished=finished) == want


def test_english_sentence_with_repeated_words_is_not_a_loop():
    assert not has_loop("what is the name of the restaurant the guest liked on the trip to the lake")
    assert has_loop("book a table book a table book a table book a table")


def test_fallback_and_summary():
    row = {"query_id": "q1", "query": "它多少钱", "profile": "女", "history": "用户问了深海鱼油"}
    assert fallback(row) == "它多少钱 用户问了深海鱼油" and fallback({**row, "history": ""}) == "它多少钱"
    assert source_text(row) == "它多少钱 女 用户问了深海鱼油"
    s = summarize([None, "loop", None, "unfinished"], ["a", "b", "c", "d"], ["x", "yyy", "z", "w"])
    assert s["n"] == 2 and s["share"] == 0.5 and s["by_reason"] == {"unfinished": 1, "loop": 1}
    assert [e["query_id"] for e in s["examples"]] == ["b", "d"] and s["examples"][0]["rewrite"] == "yyy"
    assert set(s["by_reason"]) <= set(REASONS)
