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
from qrewrite.io_utils import write_json, write_jsonl
from qrewrite.lineage.document import model_files
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
    """models/T/release as the release stage writes it (its lineage.json a stand-in that records the folder's files,
    which is what the gateway checks before a release serves)."""
    out = project.root / tenant_paths(tenant)["release"]
    doc = {"tenant": tenant, "split": "val", "released": released, "decision": {"why": "a test's release"}}
    write_release(str(out), doc, str(model_dir) if model_dir else None)
    write_json(out / "lineage.json", {"format": "test stand-in", "tenant": tenant, "note": note,
                                      "model": {"dir": tenant_paths(tenant)["release"], "files": model_files(out)}})
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
    # float32: the tiny model's logits are near ties, and bfloat16 rounding of a padded batch could flip one
    cfg["eval"]["generation"].update({"max_new_tokens": 8, "dtype": "float32"})
    rag_port = free_port()
    cfg["rag"] = {**cfg["rag"], "provider": "http", "http": {"base_url": f"http://127.0.0.1:{rag_port}"}}
    # swaps come on SIGHUP here: no race with the poll; a small engine, so that a burst passes its capacity
    cfg["serve"] = {"reload_poll_s": 3600, "timeout_s": 120, "engine": {"max_batch": 4, "max_queued": 4}}
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
def test_requests_batched_together_answer_the_texts_each_gets_alone(gateway):
    """fivedoctors' rows sent at once are generated in batches (the access log's batch_size), and each answer is the
    eval's release row of its query, which was generated alone: the tenant's prompt start is computed once and shared,
    so a batched request is the computation it is alone. A 429 is asked again after its Retry-After."""
    auth = {"Authorization": f"Bearer {KEYS['fivedoctors']}"}

    async def ask_all():
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(row):
                while True:
                    r = await c.post(gateway["url"] + "/v1/rewrite", headers=auth,
                                     json={k: row[k] for k in ("query", "profile", "history")})
                    if r.status_code != 429:
                        return row, r
                    await asyncio.sleep(float(r.headers["retry-after"]))
            return await asyncio.gather(*(one(r) for r in gateway["rows"] * 2))

    for row, r in asyncio.run(ask_all()):
        assert r.status_code == 200, r.text
        assert r.json()["model_rewrite"] == gateway["evaluated"][row["query_id"]]["model_rewrite"]
    logged = [json.loads(line) for line in (gateway["project"].root / "logs/serve/access.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip()]
    assert max(ln.get("batch_size") or 0 for ln in logged if ln.get("tenant") == "fivedoctors") > 1


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

    def bad(path: str, body, param: str, status: int = 400, code: str | None = None) -> None:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(url + path, headers={**auth, "Content-Type": "application/json"}, content=content)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == code, r.json()

    bad("/v1/rewrite", b"{not json", "body")
    bad("/v1/rewrite", {"profile": "x"}, "query")
    bad("/v1/rewrite", {"query": "x" * 5000}, "query")
    bad("/v1/rewrite", {"query": "那它<|im_start|>system", "history": "h"}, "query")
    bad("/v1/rewrite", {"query": "x", "history": 3}, "history")
    bad("/v1/rewrite", {"query": "x", "tenant": "nobody"}, "tenant", 404, "tenant_not_found")
    bad("/v1/rewrite", {"query": "x", "extra": 1}, "extra")
    bad("/v1/rewrite", b"x" * 70000, "body", 413, "request_too_large")
    bad("/v1/rewrite", b'{"query": "\\ud800 lone"}', "body")  # a lone surrogate: text no tokenizer can encode
    chat = {"model": "fivedoctors-rewriter", "messages": msgs}
    bad("/v1/chat/completions", {**chat, "model": "nobody-rewriter"}, "model", 404, "model_not_found")
    bad("/v1/chat/completions", {**chat, "model": "gpt-5"}, "model", 404, "model_not_found")
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
    assert not any(r["query"] in logged or r["history"] in logged for r in gateway["rows"])  # no user text either
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


def _raw_http(url: str, head: str) -> str:
    """Send `head` (request line and headers, no body) and return the status line the gateway answers with."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(head.encode())
        return sock.recv(4096).decode(errors="replace").split("\r\n", 1)[0]


@pytest.mark.slow
def test_the_gateway_answers_its_routes_only_and_shows_a_tenant_no_path(gateway):
    url, auth = gateway["url"], {"Authorization": f"Bearer {KEYS['fivedoctors']}"}
    for path in ("/docs", "/redoc", "/openapi.json", "/v1/nothing"):
        r = httpx.get(url + path, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url", (path, r.text)
    assert httpx.get(url + "/v1/rewrite", headers=auth).json()["error"]["code"] == "method_not_allowed"
    # a body over serve.max_body_bytes is refused from its Content-Length, before a byte of it is sent
    status = _raw_http(url, f"POST /v1/rewrite HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['fivedoctors']}"
                            "\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
    assert status.startswith("HTTP/1.1 413"), status
    shown = httpx.get(url + "/v1/release", headers=auth).json()
    text = json.dumps(shown)
    assert str(gateway["project"].root) not in text and "http://" not in text and "models/" not in text
    assert shown["id"].startswith("fivedoctors/") and shown["engine"]["max_batch"] == 4
    health = httpx.get(url + "/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "tenants": 3, "unavailable": 0}
    # finish_reason says whether the model's generation was cut at max_new_tokens, as the eval recorded it
    tenant = tenant_cfg(gateway, "fivedoctors")
    for row in gateway["rows"][:3]:
        resp = client(gateway, "fivedoctors").chat.completions.create(model="fivedoctors-rewriter",
                                                                     messages=rewrite_messages(tenant, row))
        want = gateway["evaluated"][row["query_id"]]
        assert resp.choices[0].finish_reason == ("stop" if want["finished"] else "length")
        assert resp.usage.completion_tokens > 0


@pytest.mark.slow
def test_a_burst_past_capacity_is_refused_at_once_and_other_tenants_are_not_delayed(gateway):
    """fivedoctors' engine takes 4 per batch and queues 4 (the fixture's serve.engine): 24 requests at once get
    answers or immediate 429s with Retry-After, never a fallback; the rule tenant answers at once meanwhile."""
    row = gateway["rows"][0]
    body = {k: row[k] for k in ("query", "profile", "history")}

    async def burst():
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(tenant: str):
                start = asyncio.get_running_loop().time()
                r = await c.post(gateway["url"] + "/v1/rewrite", json=body,
                                 headers={"Authorization": f"Bearer {KEYS[tenant]}"})
                return tenant, r, asyncio.get_running_loop().time() - start
            model = [asyncio.ensure_future(one("fivedoctors")) for _ in range(24)]
            await asyncio.sleep(0.3)
            rule = await one("rulecorp")
            return await asyncio.gather(*model), rule

    got, (_, rule_r, rule_s) = asyncio.run(burst())
    assert rule_r.status_code == 200 and rule_s < 1.0, rule_s
    refused = [(r, s) for _, r, s in got if r.status_code == 429]
    answered = [r for _, r, _ in got if r.status_code == 200]
    assert len(refused) + len(answered) == 24 and refused and len(answered) >= 4  # 4 queued, maybe 1 more running
    for r, seconds in refused:
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
        assert int(r.headers["retry-after"]) >= 1 and seconds < 2.0
    assert all(r.json()["fallback"] is None for r in answered)
    want = gateway["evaluated"][row["query_id"]]["model_rewrite"]
    assert sum(r.json()["model_rewrite"] == want for r in answered) >= 1


def _wait_for(fn, timeout: float = 120.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timed out waiting")


@pytest.mark.slow
def test_a_broken_release_never_answers_and_the_served_one_goes_on(gateway):
    project, row = gateway["project"], rows_of("chengla", 1)[0]
    auth = {"Authorization": f"Bearer {KEYS['rulecorp']}"}
    body = {"tenant": "rulecorp", **{k: row[k] for k in ("query", "profile", "history")}}
    before = httpx.post(gateway["url"] + "/v1/rewrite", headers=auth, json=body).json()
    unknown = {"name": "mystery", "source": "mystery", "kind": "rule", "rule": "no_such_rule", "sends": "?"}
    folder = put_release(project, "rulecorp", unknown, note="broken")
    tampered = {"name": "query_history", "source": "query_history", "kind": "rule", "rule": "query_history",
                "sends": "q+h"}
    for attempt in range(3):  # SIGHUP again and again: one error line for one broken release
        os.kill(gateway["proc"].pid, signal.SIGHUP)
        _wait_for(lambda: httpx.get(gateway["url"] + "/v1/release", headers=auth).json()["new_release_refused"])
        r = httpx.post(gateway["url"] + "/v1/rewrite", headers=auth, json=body)
        assert r.status_code == 200 and r.json()["release"]["id"] == before["release"]["id"]
        assert r.json()["rewrite"] == before["rewrite"]
    logged = gateway["log"].read_text(encoding="utf-8")
    assert logged.count("did not load") == 1 and "no_such_rule" in logged
    # a release edited after its lineage was written: its files no longer match, refused the same way
    put_release(project, "rulecorp", tampered, note="tampered")
    doc = json.loads((project.root / tenant_paths("rulecorp")["release"] / "release.json").read_text())
    doc["released"]["rule"] = "raw"
    (project.root / tenant_paths("rulecorp")["release"] / "release.json").write_text(json.dumps(doc))
    os.kill(gateway["proc"].pid, signal.SIGHUP)
    _wait_for(lambda: gateway["log"].read_text(encoding="utf-8").count("did not load") == 2)
    assert "not what the release's lineage recorded" in gateway["log"].read_text(encoding="utf-8")
    assert httpx.post(gateway["url"] + "/v1/rewrite", headers=auth, json=body).json()["release"]["id"] == \
        before["release"]["id"]
    # a sound release then goes live
    put_release(project, "rulecorp", tampered, note="fixed")
    os.kill(gateway["proc"].pid, signal.SIGHUP)
    now = _wait_for(lambda: (lambda j: j if j["id"] != before["release"]["id"] else None)(
        httpx.get(gateway["url"] + "/v1/release", headers=auth).json()))
    assert now["name"] == "query_history" and not now["new_release_refused"] and folder


PERTURB = """
import shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst)
g = torch.Generator().manual_seed(0)
for f in dst.glob("*.safetensors"):
    sd = load_file(f)
    sd = {k: (v * (1 + 0.5 * torch.randn(v.shape, generator=g)).to(v.dtype)) if "norm" in k else v
          for k, v in sd.items()}
    save_file(sd, f, metadata={"format": "pt"})
"""

GENERATE = """
import json, sys, torch
torch.set_num_threads(1)
from qrewrite.runtime.generate import generate_rewrites
tenant, rows, gen = json.loads(sys.stdin.read())
out, _ = generate_rewrites(sys.argv[1], tenant, rows, batch_size=1, threads=1, device="cpu",
                           max_new_tokens=gen["max_new_tokens"], trim_loops=bool(gen.get("trim_loops")),
                           dtype=gen.get("dtype"))
print(json.dumps([o["rewrite"] for o in out]))
"""


@pytest.mark.slow
def test_a_model_to_model_swap_answers_with_the_new_weights(gateway, smollm2_base, tmp_path):
    """chengla's model is replaced by other weights: once the gateway has loaded and warmed the new release, every
    answer names it and is the new weights' greedy rewrite (generated here apart, alone, as eval does)."""
    from test_reward_frameworks import train_python

    py = str(train_python("swift"))
    project, auth = gateway["project"], {"Authorization": f"Bearer {KEYS['chengla']}"}
    rows = rows_of("chengla", 3)
    ask = lambda r: httpx.post(gateway["url"] + "/v1/rewrite", headers=auth, timeout=120,  # noqa: E731
                               json={k: r[k] for k in ("query", "profile", "history")}).json()
    old = [ask(r) for r in rows]
    new_model = tmp_path / "perturbed"
    subprocess.run([py, "-c", PERTURB, str(smollm2_base), str(new_model)], check=True, capture_output=True)
    gen = {**project.config["eval"]["generation"], "append_history": True}
    put_release(project, "chengla", released_model("sft+append_history=true", gen), new_model, note="new weights")
    os.kill(gateway["proc"].pid, signal.SIGHUP)
    new_id = _wait_for(lambda: (lambda j: j["id"] if j["id"] != old[0]["release"]["id"] else None)(
        httpx.get(gateway["url"] + "/v1/release", headers=auth).json()))
    served = [ask(r) for r in rows]
    assert {s["release"]["id"] for s in served} == {new_id}
    want = json.loads(subprocess.run(
        [py, "-c", GENERATE, str(project.root / tenant_paths("chengla")["release"])], cwd=REPO, check=True,
        capture_output=True, text=True, input=json.dumps([tenant_cfg(gateway, "chengla"), rows, gen]),
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}).stdout.splitlines()[-1])
    assert [s["model_rewrite"] for s in served] == want
    assert [s["model_rewrite"] for s in served] != [o["model_rewrite"] for o in old]


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
    cfg["serve"] = {"backend": "openai", "timeout_s": 2, "on_backend_error": on_error,
                    "openai": {"base_url": fake_url}}
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

        def ask(tenant: str) -> httpx.Response:
            r = httpx.post(url + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS[tenant]}"}, json=body,
                           timeout=30)
            assert r.status_code == 200, r.text
            return r

        ok = ask("fivedoctors").json()  # the backend answers: its text, finished as eval finishes a completion
        assert ok["fallback"] is None and ok["model_rewrite"] == f"改写：{row['query']}" == ok["rewrite"]
        assert fake_openai.requests()[-1]["model"] == "fivedoctors-rewriter"
        fake_openai.script(down_after={"n": 0, "status": 500})  # the model server fails from now on
        down = ask("chengla")
        assert down.json()["fallback"] == "backend_error" and down.headers["x-qrewrite-fallback"] == "backend_error"
        assert down.json()["rewrite"] == f"{row['query']} {row['history']}"
        assert httpx.get(url + "/healthz").json() == {"status": "degraded", "tenants": 2, "unavailable": 1}
        fake_openai.script(latency_s=5)  # later than serve.timeout_s
        late = ask("fivedoctors").json()
        assert late["fallback"] == "backend_timeout" and late["rewrite"] == f"{row['query']} {row['history']}"
    finally:
        stop(proc)
    fake_openai.script()
    project = Project(tmp_path / "proj503")
    proc, url = _remote_gateway(project, tmp_path, fake_openai.url, "503")
    try:
        fake_openai.script(down_after={"n": 0, "status": 500})
        r = httpx.post(url + "/v1/rewrite", headers={"Authorization": f"Bearer {KEYS['chengla']}"},
                       json={"query": "x"}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        stop(proc)


@pytest.mark.slow
def test_behind_a_model_server_a_swap_loads_the_new_adapter_and_the_answer_names_it(tmp_path, fake_openai):
    """serve.openai.runtime_lora: an SFT release goes live by loading its adapter into the model server (vLLM's
    runtime LoRA API, as the test fake enforces it) under a name carrying its release id; a swap loads the new one,
    asks for it by that name, then unloads the old; a release whose adapter cannot be loaded never answers."""
    project = Project(tmp_path / "proj")
    cfg = project.config
    for t in cfg["tenants"]:
        t.update(judge_labels=None, gold_set=None, red_team=None)
    cfg["serve"] = {"backend": "openai", "timeout_s": 5, "reload_poll_s": 3600, "drain_s": 1,
                    "openai": {"base_url": fake_openai.url, "runtime_lora": True}}
    project.set_config(cfg)
    adapter = project.root / tenant_paths("fivedoctors")["sft_model"]
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "base_model_name_or_path": "models/base"}))
    gen = {**project.config["eval"]["generation"], "max_new_tokens": 16}
    put_release(project, "fivedoctors", released_model("sft", gen), note="first")
    put_release(project, "chengla", {"name": "query_history", "source": "query_history", "kind": "rule",
                                     "rule": "query_history", "sends": "q+h"})
    port = free_port()
    proc = start_server([sys.executable, "-m", "qrewrite", "serve", "--config", "config.yaml", "--port", str(port)],
                        f"http://127.0.0.1:{port}/healthz", project.root, tmp_path / "gw.log", env=ENV)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEYS['fivedoctors']}"}
    try:
        ask = lambda: httpx.post(url + "/v1/rewrite", headers=auth, json={"query": "那它孕妇能吃吗"},  # noqa: E731
                                 timeout=30).json()
        first = ask()
        first_model = f"fivedoctors-rewriter@{first['release']['id'].rsplit('@', 1)[1]}"
        loads = [r for r in fake_openai.requests() if r["endpoint"] == "load_lora_adapter"]
        assert [r["body"] for r in loads] == [{"lora_name": first_model, "lora_path": str(adapter.resolve())}]
        assert fake_openai.requests()[-1]["model"] == first_model and first["fallback"] is None
        put_release(project, "fivedoctors", released_model("sft", gen), note="second")
        os.kill(proc.pid, signal.SIGHUP)
        new_id = _wait_for(lambda: (lambda j: j["id"] if j["id"] != first["release"]["id"] else None)(
            httpx.get(url + "/v1/release", headers=auth).json()))
        second = ask()
        second_model = f"fivedoctors-rewriter@{new_id.rsplit('@', 1)[1]}"
        assert second["release"]["id"] == new_id and fake_openai.requests()[-1]["model"] == second_model
        _wait_for(lambda: any(r["endpoint"] == "unload_lora_adapter" and r["body"]["lora_name"] == first_model
                              for r in fake_openai.requests()), timeout=30)
        # a release whose adapter is gone: the server refuses to load it, and the served release goes on
        for f in adapter.iterdir():
            f.unlink()
        put_release(project, "fivedoctors", released_model("sft", gen), note="third, no adapter")
        os.kill(proc.pid, signal.SIGHUP)
        _wait_for(lambda: httpx.get(url + "/v1/release", headers=auth).json()["new_release_refused"])
        third = ask()
        assert third["release"]["id"] == new_id and fake_openai.requests()[-1]["model"] == second_model
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_release_whose_backend_cannot_answer_does_not_start(tmp_path):
    """Nothing listens at the model server: the warm-up request fails and the gateway exits, naming the release,
    instead of serving the rule to every request."""
    project = Project(tmp_path / "proj")
    dead = free_port()
    cfg = project.config
    cfg["serve"] = {"backend": "openai", "timeout_s": 2, "openai": {"base_url": f"http://127.0.0.1:{dead}/v1"}}
    project.set_config(cfg)
    for t in ("fivedoctors", "chengla"):
        put_release(project, t, released_model("sft", {**project.config["eval"]["generation"]}), model_dir=None)
    proc = subprocess.run([sys.executable, "-m", "qrewrite", "serve", "--config", "config.yaml", "--port",
                           str(free_port())], cwd=project.root, env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "warm-up" in proc.stderr and "fivedoctors/sft@" in proc.stderr, proc.stderr[-2000:]


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
    # two servers on the job's one GPU: each holds half of deploy.production.gpu_memory_utilization (0.9)
    for srv in (lora, merged):
        assert srv["argv"][srv["argv"].index("--gpu-memory-utilization") + 1] == "0.45"
    assert p["rule_tenants"] == ["rulecorp"] and p["tenants"]["fivedoctors"]["decoding_client_step"] == "route_by_retrieval"
    args = build_parser().parse_args(p["gateway"]["argv"][1:])
    assert args.backend == "openai" and sorted(args.openai_base_url_for) == [
        "chengla=http://{MODEL_HOST}:8001/v1", "fivedoctors=http://{MODEL_HOST}:8000/v1"]
    script = (project.root / "reports/serve/serve.sbatch").read_text()
    assert subprocess.run(["bash", "-n", "reports/serve/serve.sbatch"], cwd=project.root).returncode == 0
    assert "export QREWRITE_KEY_RULECORP=..." in script and "--openai-base-url-for chengla=http://127.0.0.1:8001/v1" in script
