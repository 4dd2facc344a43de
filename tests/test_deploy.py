"""`qrewrite deploy-check`: the tenant's release served through the gateway (`qrewrite serve`) on loopback, every test
row sent as its RAG service would (the OpenAI SDK), deploy.json checked against the eval's release rows: with the
tests' tiny model in the gateway (texts identical to the eval's), and behind a real `swift deploy` model server;
and a server's lifecycle (ready, failed start, SIGTERM, SIGKILL of the check) with a stand-in server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, TINY_BASE, Project
from qrewrite.io_utils import write_json
from qrewrite.lineage.document import model_files
from qrewrite.paths import deploy_json, eval_paths, tenant_paths
from qrewrite.release.folder import write_release

TENANT = "fivedoctors"
PATHS = tenant_paths(TENANT)
EVAL_PATHS = eval_paths(TENANT)
SECRET = "sk-deploy-test-not-a-real-key"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie is gone, only not yet reaped
    except FileNotFoundError:
        return False


def cmdlines_with(*parts: str) -> list[int]:
    """Live processes whose command line has every one of `parts` as an argument."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            if all(x.encode() in args for x in parts) and alive(int(p)):
                out.append(int(p))
        except OSError:
            pass
    return out


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, smollm2_base):
    """Data half (60 queries); the tiny model released routed by retrieval (the release stage's folder, its lineage
    a stand-in); the eval's release rows of 3 test rows; then `qrewrite deploy-check` through the gateway."""
    root = tmp_path_factory.mktemp("deploy")
    project = Project(root / "proj")
    project.keep_queries(TENANT, 60)
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check"):
        project.stage(stage)
    cfg = project.config
    # 3 rows, 8 new tokens, no judge: the check's cost is the serving, not the eval; bfloat16 as config.yaml decodes
    cfg["eval"] = {"candidates": [{"name": "release", "kind": "release"}], "baseline": "release", "compare": [],
                   "headline": ["release"], "max_rows": 3,
                   "generation": {"max_new_tokens": 8, "dtype": "bfloat16"}, "judge_sample_share": 0.0}
    cfg["deploy"] = {"backend": "inprocess"}
    cfg["base_model"] = dict(TINY_BASE)  # the model served: swift deploy's --model_type/--template
    project.set_config(cfg)
    project.update_tenant(TENANT, judge_labels=None, gold_set=None, red_team=None)  # the split's rows only
    decoding = {**project.config["eval"]["generation"], "route_by_retrieval": True}
    write_release(str(project.root / PATHS["release"]), {"released": {
        "name": "sft+route_by_retrieval=true", "source": "sft", "kind": "model", "artifact": "sft_merged",
        "decoding": decoding}}, str(smollm2_base))
    # a stand-in lineage that records the folder's files, which the gateway checks before the release serves
    write_json(project.root / PATHS["release"] / "lineage.json", {"format": "test stand-in", "model": {
        "dir": PATHS["release"], "files": model_files(project.root / PATHS["release"])}})
    base = ["--config", "config.yaml", "--tenant", TENANT, "--test", PATHS["test"], "--queries", PATHS["queries"]]
    rel = EVAL_PATHS["rewrites"].format(candidate="release")
    project.qrewrite("eval-generate", *base, "--candidate", "release", "--model", PATHS["release"], "--threads", "1",
                     "--out", rel)
    project.qrewrite("eval", *base, "--teacher", PATHS["teacher"], "--reward-check", PATHS["reward_check"],
                     "--rewrites", rel, "--out", EVAL_PATHS["eval_json"], "--examples", EVAL_PATHS["examples"],
                     "--plots", EVAL_PATHS["plots"])
    check = [*base, "--model", PATHS["release"], "--eval-json", EVAL_PATHS["eval_json"], "--eval-rewrites", rel,
             "--server-log", f"logs/{TENANT}/deploy_server.log"]
    env = {"QREWRITE_BACKEND_API_KEY": SECRET}
    run = project.qrewrite("deploy-check", *check, "--out", deploy_json(TENANT), env=env)
    doc = json.loads((project.root / deploy_json(TENANT)).read_text(encoding="utf-8"))
    return project, doc, check, run


@pytest.mark.slow
def test_the_gateway_serves_the_eval_texts_with_latency_per_concurrency(deployed):
    """The model in the gateway, each request generated alone as the eval's release rows were: the same texts,
    so Hit@1 served equals the eval's, paired difference exactly 0; every answer named the release."""
    project, doc, _, _ = deployed
    ev = json.loads((project.root / EVAL_PATHS["eval_json"]).read_text(encoding="utf-8"))
    assert doc["tenant"] == TENANT and doc["n_queries"] == 3 and doc["gateway"]["backend"] == "inprocess"
    assert doc["release_id"].startswith(f"{TENANT}/sft+route_by_retrieval=true@") and doc["model_server"] is None
    assert doc["texts_identical_to_eval"] is True
    h = doc["hit_at_1"]
    assert h["eval_json"] == ev["candidates"]["release"]["hit_at_1"]["mean"] and h["eval_json_reproduced"]
    assert h["served"] == h["eval"] and h["paired_served_minus_eval"]["diff"] == 0 and h["within_noise"] is True
    assert set(doc["latency"]) == {"1", "8", "32"}
    for level, s in doc["latency"].items():
        assert s["n"] == 3 and s["errors"] == 0 and s["effective_concurrency"] == min(int(level), 3)
        lat = s["latency_s"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["max"]
        assert s["requests_per_s"] == pytest.approx(3 / s["wall_s"], rel=1e-3)
        assert sum(s["routed_to"].values()) == 3  # route_by_retrieval: each answer routed, as the eval's
    rows = project.read_jsonl(EVAL_PATHS["rewrites"].format(candidate="release"))
    assert all(r["routed_to"] in ("own", "own+history", "query_history") for r in rows)
    access = project.read_jsonl(f"logs/{TENANT}/deploy_access.jsonl")
    assert len(access) == 1 + 3 * 3 and {a["release"] for a in access} == {doc["release_id"]}


@pytest.mark.slow
def test_a_model_server_behind_the_gateway_and_no_secret_and_no_orphan(deployed, tmp_path):
    """deploy.backend: swift: a real `swift deploy` serves the model, the gateway calls it (serve.backend openai)
    and takes the client step itself; both are stopped after the check."""
    project, doc, check, run = deployed
    c = project.config
    c["deploy"] = {"backend": "swift", "concurrency": [1], "require_identical": False}
    project.set_config(c)
    out = tmp_path / "deploy-swift.json"
    run2 = project.qrewrite("deploy-check", *check, "--out", str(out), env={"QREWRITE_BACKEND_API_KEY": SECRET})
    d = json.loads(out.read_text(encoding="utf-8"))
    assert d["gateway"]["backend"] == "swift" and "swift.cli.deploy" in d["model_server"]["command"]
    assert "--torch_dtype bfloat16" in d["model_server"]["command"]  # the release's dtype, as the eval loaded it
    assert d["latency"]["1"]["errors"] == 0 and d["latency"]["1"]["n"] == 3
    # vLLM's template is the tokenizer's, swift's --template: the tiny model's agree, and greedy decoding of the
    # same prompt gives the eval's texts
    assert d["hit_at_1"]["by_concurrency"]["1"]["identical_texts"] == 3
    for text, r in ((out.read_text(encoding="utf-8"), run2), (json.dumps(doc), run)):
        assert SECRET not in text and SECRET not in r.stderr
    for server in (d["gateway"], d["model_server"]):
        port = int(server.get("base_url", "").rsplit(":", 1)[1].split("/")[0]) if "base_url" in server else None
        if port:
            assert not port_open(port), "a server still listens after the check"
    assert not cmdlines_with("swift.cli.deploy"), "the model server outlived the check"
    assert not cmdlines_with("serve", "--release"), "the gateway outlived the check"


@pytest.mark.slow
def test_a_release_folder_that_is_not_one_is_a_clear_error(deployed, tmp_path):
    project, _, check, _ = deployed
    args = list(check)
    args[args.index("--model") + 1] = str(tmp_path / "nope")
    proc = project.qrewrite("deploy-check", *args, "--out", str(tmp_path / "d.json"), check=False)
    assert proc.returncode == 2 and "no release.json" in proc.stderr and "snakemake models" in proc.stderr
    assert not (tmp_path / "d.json").exists()


# ------------------------------------------------------------------------------ lifecycle, stand-in server

STANDIN = textwrap.dedent("""
    import http.server, json, sys, time
    port, name, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    if delay < 0:
        print("cannot load the model", flush=True); sys.exit(3)
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": name}]}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def standin(tmp_path, name="m", delay=0.0):
    from qrewrite.procs import free_port

    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    port = free_port("127.0.0.1")
    return [sys.executable, str(script), str(port), name, str(delay)], port


def test_serving_waits_for_the_model_and_stops_the_server(tmp_path):
    from qrewrite.deploy.server import serving

    argv, port = standin(tmp_path, delay=1.0)
    with serving(argv, base_url=f"http://127.0.0.1:{port}/v1", name="m", log_path=tmp_path / "s.log",
                 timeout=30) as info:
        assert info["startup_s"] >= 1.0 and port_open(port)
        pid = info["pid"]
    assert not alive(pid) and not port_open(port)


@pytest.mark.slow
def test_a_server_that_exits_or_never_lists_the_model_is_an_error_and_is_stopped(tmp_path):
    from qrewrite.deploy.server import serving
    from qrewrite.errors import QrewriteError

    argv, port = standin(tmp_path, delay=-1)
    with pytest.raises(QrewriteError, match=r"exited with code 3[\s\S]*cannot load the model"):
        with serving(argv, base_url=f"http://127.0.0.1:{port}/v1", name="m", log_path=tmp_path / "a.log", timeout=30):
            pass
    argv, port = standin(tmp_path, name="other")
    with pytest.raises(QrewriteError, match="did not list 'm'.*within 3s"):
        with serving(argv, base_url=f"http://127.0.0.1:{port}/v1", name="m", log_path=tmp_path / "b.log", timeout=3):
            pass
    assert not port_open(port)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_dies_with_the_check(tmp_path, sig):
    """Snakemake stops a job with SIGTERM (the cleanup runs); kill -9 leaves no cleanup, the parent-death
    signal stops the server instead. Either way no server is left."""
    argv, port = standin(tmp_path)
    code = textwrap.dedent(f"""
        import sys, time
        from qrewrite.deploy.server import serving
        with serving({argv!r}, base_url="http://127.0.0.1:{port}/v1", name="m", log_path={str(tmp_path / 's.log')!r},
                     timeout=30) as info:
            print(info["pid"], flush=True)
            time.sleep(600)
    """)
    check = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    pid = int(check.stdout.readline())
    assert alive(pid) and port_open(port)
    check.send_signal(sig)
    check.wait(30)
    deadline = time.time() + 15
    while alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(pid) and not port_open(port)


def test_backend_choice_and_the_vllm_command(monkeypatch):
    """auto takes vLLM where it is importable (a GPU node), else the model in the gateway; a named server must be
    installed."""
    from qrewrite.deploy import server
    from qrewrite.errors import QrewriteError

    installed = {"swift"}
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda m: object() if m in installed else None)
    assert server.choose_backend("auto")[0] == "inprocess"
    assert server.choose_backend("swift")[0] == "swift"
    with pytest.raises(QrewriteError, match="deploy.backend is vllm but 'vllm' is not importable"):
        server.choose_backend("vllm")
    installed.add("vllm")
    assert server.choose_backend("auto")[0] == "vllm"
    argv = server.server_argv("vllm", "models/t/rl", host="127.0.0.1", port=8001, name="t-rewriter", device="cuda",
                              model_type="qwen3", template="qwen3", max_batch_size=8, max_model_len=2048,
                              launcher=["/env/bin/vllm", "serve"])
    assert argv == ["/env/bin/vllm", "serve", "models/t/rl", "--host", "127.0.0.1", "--port", "8001",
                    "--served-model-name", "t-rewriter", "--dtype", "bfloat16", "--max-model-len", "2048"]
