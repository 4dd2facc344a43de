"""What counts as a degenerate rewrite (qrewrite.runtime.degenerate), and its fallback."""

from __future__ import annotations

import pytest

from qrewrite.runtime.degenerate import REASONS, degeneracy, fallback, has_loop, source_text, summarize, trim_loop


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


@pytest.mark.parametrize("text, want", [
    ("深海鱼软胶囊软胶囊软胶囊软胶囊软胶囊软胶囊软胶囊软", "深海鱼软胶囊"),              # seen on fivedoctors (SFT)
    ("乳清蛋白粉粉粉粉粉粉粉粉", "乳清蛋白粉"),
    ("复合维生素B片复合维生素C片复合维生素D片", "复合维生素B片"),                        # a pattern, not one stretch
    ("I want Safeway 1 mile away at a grocery store Safeway 1 mile away at Safeway 1 mile away", "I want Safeway 1 "
     "mile away at a grocery store"),
    ("奶蓟草护肝片什么时候吃效果好", "奶蓟草护肝片什么时候吃效果好"),                    # no loop: unchanged
    ("哈哈哈", "哈哈哈"), ("1000元以内的鱼油", "1000元以内的鱼油"),
])
def test_trim_loop_cuts_where_the_loop_began(text, want):
    out = trim_loop(text)
    assert out == want
    assert not has_loop(out)
    assert degeneracy(out, source=want, finished=True) is None
    assert trim_loop("") == ""


def test_eval_judges_a_trimmed_rewrite_as_finished_and_counts_it():
    from qrewrite.eval.score import _degenerate

    rows = [{"query_id": "a", "query": "深海鱼油怎么吃", "profile": "", "history": ""},
            {"query_id": "b", "query": "氨糖怎么存放", "profile": "", "history": ""}]
    rws = [{"query_id": "a", "status": "ok", "rewrite": "深海鱼软胶囊", "finished": False, "loop_trimmed": True},
           {"query_id": "b", "status": "ok", "rewrite": "氨糖氨糖氨糖氨糖氨糖氨糖", "finished": False}]
    per = [{"query_id": r["query_id"], "rewrite": r["rewrite"], "hit_at_1": 1.0, "top1": 0.5} for r in rws]
    out = _degenerate("sft", rws, rows, per, None, {"samples": 50, "seed": 0, "confidence": 0.95})
    assert out["loops_trimmed"] == 1
    assert out["degenerate"]["n"] == 1 and out["degenerate"]["by_reason"] == {"loop": 1}
