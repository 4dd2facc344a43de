"""The rewrite gateway (`qrewrite serve`) as a tenant's RAG service meets it: real servers on loopback.

One gateway (the swift env, the tests' tiny model in process) serves three tenants' releases: fivedoctors routed by
retrieval through a real `qrewrite serve-rag` (the RAG's HTTP API), chengla with the history appended, and a rule
tenant (query + history, no model). Its answers are checked against the eval's release rows of the same model
(`qrewrite eval-generate --candidate release`: text for text), its keys, its 400s, the hot swap of a release under
load, and the RAG going down. A second gateway (the data env) has the OpenAI-compatible backend: a scripted test
server (tests/fake_openai_server.py, a test fake) that answers late, and a port where nothing listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from openai import AuthenticationError, BadRequestError, OpenAI, PermissionDeniedError

from conftest import REPO, TINY_BASE, Project, free_port, start_server, stop
from qrewrite.io_utils import read_jsonl, write_json, write_jsonl
from qrewrite.paths import eval_paths, tenant_paths
from qrewrite.prompts import rewrite_messages
from qrewrite.release.folder import write_release
from qrewrite.serve.keys import key_env

KEYS = {"fivedoctors": "key-fivedoctors-0123456789", "chengla": "key-chengla-0123456789",
        "rulecorp": "key-rulecorp-0123456789"}
ENV = {key_env("QREWRITE_KEY_{TENANT}", t): k for t, k in KEYS.items()}
N_ROWS = 6


def released_model(name: str, decoding: dict) -> dict:
    return {"name": name, "source": "sft", "kind": "model", "artifact": "sft_merged", "decoding": decoding}


def put_release(project: Project, tenant: str, released: dict, model_dir=None, note: str = "") -> str:
    """models/T/release as the release stage writes it (its lineage.json a stand-in: the gateway only hashes it)."""
    out = project.root / tenant_paths(tenant)["release"]
    doc = {"tenant": tenant, "split": "val", "released": released, "decision": {"why": "a test's release"}}
    write_release(str(out), doc, str(model_dir) if model_dir else None)
    write_json(out / "lineage.json", {"format": "test stand-in", "tenant": tenant, "note": note})
    return str(out)


def rows_of(tenant: str, n: int) -> list[dict]:
    """The demo tenant's first n queries with a history: what routing and pasting act on."""
    src = [json.loads(line) for line in (REPO / f"data/demo/{tenant}.queries.jsonl").read_text("utf-8").splitlines()]
    picked = [r for r in src if r["history"]][:n]
    return [{"query_id": f"{tenant}-{i}", "query": r["query"], "profile": r["profile"] or None,
             "history": r["history"], "gold_doc_ids": r["gold_doc_ids"]} for i, r in enumerate(picked)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, smollm2_base):
    root = tmp_path_factory.mktemp("serve")
    project = Project(root / "proj")
    cfg = project.config
    rulecorp = {**next(t for t in cfg["tenants"] if t["name"] == "chengla"), "name": "rulecorp",
                "raw_excel": "data/raw/rulecorp.xlsx", "demo_source": None}
    cfg["tenants"].append(rulecorp)
    for t in cfg["tenants"]:
        t.update(judge_labels=None, gold_set=None, red_team=None)
    cfg["base_model"] = dict(TINY_BASE)
    cfg["eval"]["generation"].update({"max_new_tokens": 8})
    rag_port = free_port()
    cfg["rag"] = {**cfg["rag"], "provider": "http", "http": {"base_url": f"http://127.0.0.1:{rag_port}"}}
    cfg["serve"] = {"reload_poll_s": 3600, "timeout_s": 120}  # swaps come on SIGHUP here: no race with the poll
    project.set_config(cfg)
    rag = start_server([sys.executable, "-m", "qrewrite", "serve-rag", "--config", "config.yaml", "--port",
                        str(rag_port)], f"http://127.0.0.1:{rag_port}/healthz", project.root, root / "rag.log")
    gen = {**project.config["eval"]["generation"]}
    put_release(project, "fivedoctors", released_model("sft+route_by_retrieval=true",
                                                       {**gen, "route_by_retrieval": True}), smollm2_base)
    put_release(project, "chengla", released_model("sft+append_history=true", {**gen, "append_history": True}),
                smollm2_base)
    put_release(project, "rulecorp", {"name": "query_history", "source": "query_history", "kind": "rule",
                                      "rule": "query_history", "sends": "the query with the history"})
    # the eval's release rows of fivedoctors' rows, as `snakemake eval` makes them
    rows = rows_of("fivedoctors", N_ROWS)
    paths = tenant_paths("fivedoctors")
    write_jsonl(project.root / paths["queries"], [{"id": r["query_id"], "row": i + 2, **{k: r[k] for k in (
        "query", "profile", "history", "gold_doc_ids")}} for i, r in enumerate(rows)])
    write_jsonl(project.root / paths["test"], [{"meta": {"query_id": r["query_id"]}} for r in rows])
    out = eval_paths("fivedoctors")["rewrites"].format(candidate="release")
    project.qrewrite("eval-generate", "--config", "config.yaml", "--tenant", "fivedoctors", "--candidate", "release",
                     "--test", paths["test"], "--queries", paths["queries"], "--model", paths["release"],
                     "--threads", "1", "--out", out, env={"OMP_NUM_THREADS": "1"})
    evaluated = {r["query_id"]: r for r in project.read_jsonl(out)}
    port = free_port()
    proc = start_server([sys.executable, "-m", "qrewrite", "serve", "--config", "config.yaml", "--port", str(port),
                         "--threads", "1"], f"http://127.0.0.1:{port}/healthz", project.root, root / "gateway.log",
                        env={**ENV, "OMP_NUM_THREADS": "1"}, timeout=300)
    yield {"project": project, "url": f"http://127.0.0.1:{port}", "rows": rows, "evaluated": evaluated,
           "proc": proc, "rag": rag, "log": root / "gateway.log"}
    stop(proc)
    stop(rag)


def client(gw: dict, tenant: str) -> OpenAI:
    return OpenAI(base_url=gw["url"] + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)


def tenant_cfg(gw: dict, name: str) -> dict:
    return next(t for t in gw["project"].config["tenants"] if t["name"] == name)


@pytest.mark.slow
def test_a_routed_release_answers_the_texts_the_eval_scored(gateway):
    """fivedoctors' RAG service as it calls an API teacher (the OpenAI SDK, the same messages): each reply is the
    eval's release row of the same query, text for text, routed the same way, naming the release."""
    api, tenant = client(gateway, "fivedoctors"), tenant_cfg(gateway, "fivedoctors")
    folder = gateway["project"].root / tenant_paths("fivedoctors")["release"]
    import hashlib

    release_id = ("fivedoctors/sft+route_by_retrieval=true@"
                  + hashlib.sha256((folder / "lineage.json").read_bytes()).hexdigest()[:12])
    for row in gateway["rows"]:
        raw = api.chat.completions.with_raw_response.create(model="fivedoctors-rewriter",
                                                            messages=rewrite_messages(tenant, row))
        resp, want = raw.parse(), gateway["evaluated"][row["query_id"]]
        extra = resp.model_extra["qrewrite"]
        assert resp.choices[0].message.content == want["rewrite"]
        assert extra["model_rewrite"] == want["model_rewrite"] and extra["routed_to"] == want["routed_to"]
        assert raw.headers["x-qrewrite-release"] == extra["release"]["id"] == release_id
        # the structured endpoint answers the same
        r = httpx.post(gateway["url"] + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS['fivedoctors']}"},
                       json={k: row[k] for k in ("query", "profile", "history")}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["rewrite"] == want["rewrite"] and body["release"]["id"] == release_id
        assert body["routed_to"] in ("own", "own+history", "query_history") and body["fallback"] is None


@pytest.mark.slow
def test_an_appended_release_and_a_rule_release(gateway):
    for row in rows_of("chengla", 2):
        r = httpx.post(gateway["url"] + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS['chengla']}"},
                       json={"tenant": "chengla", **{k: row[k] for k in ("query", "profile", "history")}}, timeout=120)
        body = r.json()
        assert r.status_code == 200 and body["model_rewrite"] is not None and body["routed_to"] is None
        assert body["rewrite"] == f"{body['model_rewrite']} {row['history']}".strip() or body["fallback"] == "empty"
    row = rows_of("chengla", 1)[0]
    resp = client(gateway, "rulecorp").chat.completions.create(
        model="rulecorp-rewriter", messages=rewrite_messages(tenant_cfg(gateway, "rulecorp"), row))
    assert resp.choices[0].message.content == f"{row['query']} {row['history']}"
    assert resp.model_extra["qrewrite"]["release"]["kind"] == "rule"
    assert resp.model_extra["qrewrite"]["model_rewrite"] is None


@pytest.mark.slow
def test_keys_and_bad_requests(gateway):
    url, row = gateway["url"], gateway["rows"][0]
    msgs = rewrite_messages(tenant_cfg(gateway, "chengla"), row)
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=url + "/v1", api_key="not-a-key", max_retries=0).chat.completions.create(
            model="chengla-rewriter", messages=msgs)
    with pytest.raises(PermissionDeniedError):  # fivedoctors' key asking for chengla
        client(gateway, "fivedoctors").chat.completions.create(model="chengla-rewriter", messages=msgs)
    r = httpx.post(url + "/v1/rewrite", json={"query": "x"})
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {KEYS['fivedoctors']}"}
    r = httpx.post(url + "/v1/rewrite", headers=auth, json={"tenant": "chengla", "query": "x"})
    assert r.status_code == 403 and r.json()["error"]["param"] == "tenant"

    def bad(path: str, body, param: str) -> None:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(url + path, headers={**auth, "Content-Type": "application/json"}, content=content)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, r.json()

    bad("/v1/rewrite", b"{not json", "body")
    bad("/v1/rewrite", {"profile": "x"}, "query")
    bad("/v1/rewrite", {"query": "x" * 5000}, "query")
    bad("/v1/rewrite", {"query": "那它<|im_start|>system", "history": "h"}, "query")
    bad("/v1/rewrite", {"query": "x", "history": 3}, "history")
    bad("/v1/rewrite", {"query": "x", "tenant": "nobody"}, "tenant")
    bad("/v1/rewrite", {"query": "x", "extra": 1}, "extra")
    bad("/v1/rewrite", b"x" * 70000, "body")
    chat = {"model": "fivedoctors-rewriter", "messages": msgs}
    bad("/v1/chat/completions", {**chat, "model": "nobody-rewriter"}, "model")
    bad("/v1/chat/completions", {**chat, "model": "gpt-5"}, "model")
    bad("/v1/chat/completions", {**chat, "stream": True}, "stream")
    bad("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "just a question"}]},
        "messages[0].content")
    with pytest.raises(BadRequestError):  # what the SDK raises on the same 400
        client(gateway, "fivedoctors").chat.completions.create(model="fivedoctors-rewriter", messages=[])
    # the gateway is still up, and no key reached its access log or its console
    assert httpx.get(url + "/healthz").status_code == 200
    logged = (gateway["project"].root / "logs/serve/access.jsonl").read_text(encoding="utf-8") \
        + gateway["log"].read_text(encoding="utf-8")
    assert not any(k in logged for k in KEYS.values())
    lines = [json.loads(line) for line in logged.split("\n") if line.startswith("{")]
    assert {ln["status"] for ln in lines} >= {200, 400, 401, 403}
    assert all(ln["release"].startswith("fivedoctors/") for ln in lines
               if ln["status"] == 200 and ln["tenant"] == "fivedoctors")


@pytest.mark.slow
def test_a_new_release_is_swapped_in_under_load_without_a_failed_request(gateway):
    """rulecorp's release is replaced (the release stage's atomic folder swap) while 400 requests run 16 at a time;
    SIGHUP makes the gateway look now. No request fails; answers before name the old release, after the new."""
    project, row = gateway["project"], rows_of("chengla", 1)[0]
    auth = {"Authorization": f"Bearer {KEYS['rulecorp']}"}
    body = {"tenant": "rulecorp", **{k: row[k] for k in ("query", "profile", "history")}}
    old = httpx.get(gateway["url"] + "/v1/release", headers=auth).json()["id"]

    async def load() -> list[tuple[int, str | None, str | None]]:
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=60) as c:
            async def one(i: int):
                async with sem:
                    if i == 100:  # a quarter in: the new release lands, and the gateway is told
                        put_release(project, "rulecorp", {"name": "raw", "source": "raw", "kind": "rule",
                                                          "rule": "raw", "sends": "the query"}, note="new")
                        os.kill(gateway["proc"].pid, signal.SIGHUP)
                    r = await c.post(gateway["url"] + "/v1/rewrite", headers=auth, json=body)
                    j = r.json() if r.status_code == 200 else {}
                    return r.status_code, j.get("release", {}).get("id"), j.get("rewrite")
            return list(await asyncio.gather(*(one(i) for i in range(400))))

    got = asyncio.run(load())
    assert [s for s, *_ in got if s != 200] == []
    new = httpx.get(gateway["url"] + "/v1/release", headers=auth).json()
    assert new["id"] != old and new["id"].startswith("rulecorp/raw@")
    seen = {rid for _, rid, _ in got}
    assert seen == {old, new["id"]}, seen
    for _, rid, text in got:
        assert text == (row["query"] if rid == new["id"] else f"{row['query']} {row['history']}")
    assert new["swaps"] and new["swaps"][-1]["to"] == new["id"]


@pytest.mark.slow
def test_the_rag_down_while_routing_sends_the_models_own_text(gateway):
    """Last in the file: it stops the RAG server."""
    stop(gateway["rag"])
    row = gateway["rows"][0]
    r = httpx.post(gateway["url"] + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS['fivedoctors']}"},
                   json={k: row[k] for k in ("query", "profile", "history")}, timeout=120)
    body = r.json()
    assert r.status_code == 200 and body["fallback"] == "rag_unavailable" and body["routed_to"] == "own"
    assert body["rewrite"] == body["model_rewrite"] == gateway["evaluated"][row["query_id"]]["model_rewrite"]


def _remote_gateway(project: Project, tmp_path, fake_url: str, on_error: str) -> tuple[subprocess.Popen, str]:
    cfg = project.config
    for t in cfg["tenants"]:
        t.update(judge_labels=None, gold_set=None, red_team=None)
    dead = free_port()  # nothing listens here
    cfg["serve"] = {"backend": "openai", "timeout_s": 2, "on_backend_error": on_error,
                    "openai": {"base_url": fake_url, "base_urls": {"chengla": f"http://127.0.0.1:{dead}/v1"}}}
    project.set_config(cfg)
    gen = {**project.config["eval"]["generation"], "max_new_tokens": 16}
    for t in ("fivedoctors", "chengla"):
        put_release(project, t, released_model("sft", gen), model_dir=None)
    port = free_port()
    proc = start_server([sys.executable, "-m", "qrewrite", "serve", "--config", "config.yaml", "--port", str(port)],
                        f"http://127.0.0.1:{port}/healthz", project.root, tmp_path / f"gw-{on_error}.log",
                        env=ENV)
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_a_backend_that_fails_or_is_late_answers_the_rule_marked(tmp_path, fake_openai):
    project = Project(tmp_path / "proj")
    proc, url = _remote_gateway(project, tmp_path, fake_openai.url, "fallback")
    try:
        row = rows_of("fivedoctors", 1)[0]
        body = {k: row[k] for k in ("query", "profile", "history")}

        def ask(tenant: str) -> dict:
            r = httpx.post(url + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS[tenant]}"}, json=body,
                           timeout=30)
            assert r.status_code == 200, r.text
            return r.json()

        ok = ask("fivedoctors")  # the backend answers: its text, finished as eval finishes a completion
        assert ok["fallback"] is None and ok["model_rewrite"] == f"改写：{row['query']}" == ok["rewrite"]
        assert fake_openai.requests()[-1]["model"] == "fivedoctors-rewriter"
        down = ask("chengla")  # nothing listens at its backend
        assert down["fallback"] == "backend_error" and down["rewrite"] == f"{row['query']} {row['history']}"
        fake_openai.script(latency_s=5)  # later than serve.timeout_s
        late = ask("fivedoctors")
        assert late["fallback"] == "backend_timeout" and late["rewrite"] == f"{row['query']} {row['history']}"
    finally:
        stop(proc)
    project = Project(tmp_path / "proj503")
    proc, url = _remote_gateway(project, tmp_path, fake_openai.url, "503")
    try:
        r = httpx.post(url + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS['chengla']}"},
                       json={"query": "x"}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        stop(proc)


def test_the_gateway_does_not_start_without_every_tenants_key(tmp_path):
    project = Project(tmp_path / "proj")
    for t in ("fivedoctors", "chengla"):
        put_release(project, t, {"name": "query_history", "source": "query_history", "kind": "rule",
                                 "rule": "query_history", "sends": "q+h"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("QREWRITE_KEY_")}
    env["QREWRITE_KEY_FIVEDOCTORS"] = KEYS["fivedoctors"]
    proc = subprocess.run([sys.executable, "-m", "qrewrite", "serve", "--config", "config.yaml", "--port",
                           str(free_port())], cwd=project.root, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "QREWRITE_KEY_CHENGLA" in proc.stderr
    assert KEYS["fivedoctors"] not in proc.stderr + proc.stdout


def test_the_production_plan_shares_one_base_among_the_sft_adapters(tmp_path, monkeypatch):
    """`qrewrite serve-plan`: releases of SFT students are LoRA adapters on the one base (a multi-LoRA vLLM), a
    released RL model (merged: no adapter of the base) gets a server of its own, a rule none; the gateway's
    command points each tenant at its server and parses; the Slurm script is valid bash and names keys, never
    values."""
    from qrewrite.cli import build_parser
    from qrewrite.config import load_config

    project = Project(tmp_path / "proj")
    cfg = project.config
    cfg["tenants"].append({**cfg["tenants"][1], "name": "rulecorp", "raw_excel": "data/raw/rulecorp.xlsx",
                           "demo_source": None})
    project.set_config(cfg)
    monkeypatch.chdir(project.root)
    for t in ("fivedoctors", "chengla"):
        adapter = project.root / tenant_paths(t)["sft_model"]
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text(json.dumps({"r": 8 if t == "chengla" else 16,
                                                                 "base_model_name_or_path": "models/base"}))
    put_release(project, "fivedoctors", released_model("sft+route_by_retrieval=true", {"route_by_retrieval": True}))
    put_release(project, "chengla", {**released_model("rl", {}), "source": "rl", "artifact": "rl_model"})
    put_release(project, "rulecorp", {"name": "query_history", "source": "query_history", "kind": "rule",
                                      "rule": "query_history", "sends": "q+h"})
    cfg = load_config("config.yaml")
    from qrewrite.serve.cli import served_tenants
    from qrewrite.serve.plan import write_plan

    p = write_plan(cfg, served_tenants(cfg, None), "reports/serve")
    lora, merged = p["vllm"]
    assert lora["kind"] == "multi-lora" and lora["tenants"] == ["fivedoctors"]
    assert "fivedoctors-rewriter=models/fivedoctors/sft" in lora["argv"] and "--enable-lora" in lora["argv"]
    assert merged["kind"] == "merged" and merged["tenants"] == ["chengla"] and "models/chengla/release" in merged["argv"]
    assert p["rule_tenants"] == ["rulecorp"] and p["tenants"]["fivedoctors"]["decoding_client_step"] == "route_by_retrieval"
    args = build_parser().parse_args(p["gateway"]["argv"][1:])
    assert args.backend == "openai" and sorted(args.openai_base_url_for) == [
        "chengla=http://{MODEL_HOST}:8001/v1", "fivedoctors=http://{MODEL_HOST}:8000/v1"]
    script = (project.root / "reports/serve/serve.sbatch").read_text()
    assert subprocess.run(["bash", "-n", "reports/serve/serve.sbatch"], cwd=project.root).returncode == 0
    assert "export QREWRITE_KEY_RULECORP=..." in script and "--openai-base-url-for chengla=http://127.0.0.1:8001/v1" in script
