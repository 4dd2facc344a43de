"""`qrewrite deploy-check`: a real OpenAI-compatible server (ms-swift `swift deploy`, CPU) on loopback serving the tiny
embedded model, the eval rows through it and the local RAG, deploy.json checked against the in-process eval;
and the server's lifecycle (ready, failed start, SIGTERM, SIGKILL of the check) with a stand-in server."""

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
from qrewrite.paths import deploy_json, eval_paths, tenant_paths

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
    """Data half (60 queries), the embedded base model as the `rl` candidate, its in-process eval on 3 rows,
    then `qrewrite deploy-check` against it."""
    root = tmp_path_factory.mktemp("deploy")
    project = Project(root / "proj")
    project.keep_queries(TENANT, 60)
    for stage in ("build-excel", "ingest", "teacher", "validate", "split", "reward-check"):
        project.stage(stage)
    model = smollm2_base  # served and evaluated, never written
    cfg = project.config
    # 3 rows, 8 new tokens, no judge: the check's cost is the server, not the eval; batch 1: the eval generates
    # each rewrite alone, as the server does at concurrency 1 (a padded batch can change greedy text); bfloat16 as
    # config.yaml decodes: the server loads the same dtype
    # routed by retrieval (qrewrite.eval.route): the check must take the caller's step the eval took
    cfg["eval"] = {"candidates": [{"name": "rl", "kind": "model", "path": str(model),
                                   "generation": {"route_by_retrieval": True}}], "baseline": "rl",
                   "compare": [], "headline": ["rl"], "max_rows": 3,
                   "generation": {"max_new_tokens": 8, "batch_size": 1, "dtype": "bfloat16"},
                   "judge_sample_share": 0.0}
    cfg["deploy"] = {"candidate": "rl"}  # a model folder served directly (the release's is tests/test_release.py)
    cfg["base_model"] = dict(TINY_BASE)  # the model served: swift deploy's --model_type/--template
    project.set_config(cfg)
    project.update_tenant(TENANT, judge_labels=None, gold_set=None, red_team=None)  # the split's rows only
    base = ["--config", "config.yaml", "--tenant", TENANT, "--test", PATHS["test"], "--queries", PATHS["queries"]]
    rl = EVAL_PATHS["rewrites"].format(candidate="rl")
    project.qrewrite("eval-generate", *base, "--candidate", "rl", "--model", str(model), "--threads", "1", "--out", rl)
    project.qrewrite("eval", *base, "--teacher", PATHS["teacher"], "--reward-check", PATHS["reward_check"],
                     "--rewrites", rl, "--out", EVAL_PATHS["eval_json"], "--examples", EVAL_PATHS["examples"],
                     "--plots", EVAL_PATHS["plots"])
    env = {"QREWRITE_REWRITER_API_KEY": SECRET}
    run = project.qrewrite("deploy-check", *base, "--model", str(model), "--eval-json", EVAL_PATHS["eval_json"], "--eval-rewrites", rl,
                           "--server-log", f"logs/{TENANT}/deploy_server.log", "--threads", "1", "--out", deploy_json(TENANT),
                           env=env)
    doc = json.loads((project.root / deploy_json(TENANT)).read_text(encoding="utf-8"))
    return project, doc, model, run


@pytest.mark.slow
def test_deploy_json_latency_throughput_and_rows(deployed):
    project, doc, model, _ = deployed
    assert doc["tenant"] == TENANT and doc["candidate"] == "rl" and doc["model"] == str(model)
    assert doc["n_queries"] == 3 and doc["n_with_gold"] <= 3
    assert doc["server"]["backend"] == "swift" and "vllm" in doc["server"]["why"]  # vllm is not in the CPU env
    assert doc["server"]["startup_s"] > 0 and "swift.cli.deploy" in doc["server"]["command"]
    assert "--torch_dtype bfloat16" in doc["server"]["command"]  # eval.generation.dtype, as the eval loaded it
    assert set(doc["latency"]) == {"1", "8"}
    for level, s in doc["latency"].items():
        assert s["n"] == 3 and s["errors"] == 0 and s["effective_concurrency"] == min(int(level), 3)
        lat = s["latency_s"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["max"]
        assert s["requests_per_s"] == pytest.approx(3 / s["wall_s"], rel=1e-3)
        assert 3 <= s["completion_tokens"] <= 3 * 8  # max_tokens = eval.generation.max_new_tokens
        assert s["completion_tokens_per_s"] == pytest.approx(s["completion_tokens"] / s["wall_s"], rel=1e-3)
    # one request at a time cannot take longer in all than its requests' latencies summed
    one = doc["latency"]["1"]
    assert one["wall_s"] >= 3 * one["latency_s"]["mean"] * 0.99
    assert doc["request"]["max_tokens"] == 8 and doc["request"]["temperature"] == 0.0


@pytest.mark.slow
def test_hit_at_1_through_the_server_equals_the_in_process_eval(deployed):
    """Greedy decoding of the same prompt in the same dtype: the served rewrites are the in-process eval's,
    so Hit@1 through the server and the RAG equals eval.json's, with a paired difference of exactly 0."""
    project, doc, _, _ = deployed
    ev = json.loads((project.root / EVAL_PATHS["eval_json"]).read_text(encoding="utf-8"))
    h = doc["hit_at_1"]
    assert h["in_process_eval_json"] == ev["candidates"]["rl"]["hit_at_1"]["mean"]
    assert h["eval_json_reproduced"] and h["in_process"] == pytest.approx(h["in_process_eval_json"], abs=1e-6)
    c1 = h["by_concurrency"]["1"]
    assert c1["identical_rewrites"] == 3 and c1["identical_share"] == 1.0
    assert h["headline_concurrency"] == 1 and h["served"] == h["in_process"]
    assert h["paired_served_minus_in_process"]["diff"] == 0 and h["within_noise"] is True
    assert h["paired_served_minus_in_process"]["n"] == doc["n_with_gold"]
    assert doc["in_process"]["generation"]["batch_size"] == 1
    assert doc["in_process"]["latency_s_eval_json"] == ev["candidates"]["rl"]["latency_s"]
    assert set(h["by_concurrency"]) == {"1", "8"}
    # the served rewrites went through the caller's step: each routed to one of its three texts, as in-process
    assert "top hit scores highest" in doc["client_step"]
    rows = project.read_jsonl(EVAL_PATHS["rewrites"].format(candidate="rl"))
    assert rows and all(r["routed_to"] in ("own", "own+history", "query_history") and "model_rewrite" in r for r in rows)


@pytest.mark.slow
def test_production_command_and_no_secret_and_no_orphan(deployed):
    project, doc, model, run = deployed
    prod = doc["production"]
    assert prod["gpu_vllm"].startswith('VLLM_API_KEY="$QREWRITE_REWRITER_API_KEY" ')
    assert f"serve {model} --host 0.0.0.0 --port 8000" in prod["gpu_vllm"] and "--dtype bfloat16" in prod["gpu_vllm"]
    assert prod["swift"].startswith("swift deploy --model ") and prod["swift"].endswith(
        '--api_key "$QREWRITE_REWRITER_API_KEY"')
    text = (project.root / deploy_json(TENANT)).read_text(encoding="utf-8")
    assert SECRET not in text and SECRET not in run.stderr
    port = int(doc["server"]["base_url"].rsplit(":", 1)[1].split("/")[0])
    assert not port_open(port), "the model server still listens after the check"
    assert not cmdlines_with("swift.cli.deploy", str(model)), "a server process outlived the check"
    assert "stopped" in run.stderr


@pytest.mark.slow
def test_a_model_folder_that_is_not_one_is_a_clear_error(deployed, tmp_path):
    project, _, _, _ = deployed
    base = ["--config", "config.yaml", "--tenant", TENANT, "--test", PATHS["test"], "--queries", PATHS["queries"]]
    proc = project.qrewrite("deploy-check", *base, "--model", str(tmp_path / "nope"), "--eval-json", EVAL_PATHS["eval_json"],
                            "--eval-rewrites", EVAL_PATHS["rewrites"].format(candidate="rl"), "--server-log",
                            str(tmp_path / "s.log"), "--out", str(tmp_path / "d.json"), check=False)
    assert proc.returncode == 2 and "no config.json" in proc.stderr and "snakemake models" in proc.stderr
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
    from qrewrite.deploy.server import free_port

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
    """auto takes vLLM where it is importable (a GPU node), else ms-swift; a named backend must be installed."""
    from qrewrite.deploy import server
    from qrewrite.errors import QrewriteError

    installed = {"swift"}
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda m: object() if m in installed else None)
    assert server.choose_backend("auto")[0] == "swift"
    with pytest.raises(QrewriteError, match="deploy.backend is vllm but 'vllm' is not importable"):
        server.choose_backend("vllm")
    installed.add("vllm")
    assert server.choose_backend("auto")[0] == "vllm"
    installed.clear()
    with pytest.raises(QrewriteError, match="neither vllm nor ms-swift"):
        server.choose_backend("auto")
    argv = server.server_argv("vllm", "models/t/rl", host="127.0.0.1", port=8001, name="t-rewriter", device="cuda",
                              model_type="qwen3", template="qwen3", max_batch_size=8, max_model_len=2048,
                              launcher=["/env/bin/vllm", "serve"])
    assert argv == ["/env/bin/vllm", "serve", "models/t/rl", "--host", "127.0.0.1", "--port", "8001",
                    "--served-model-name", "t-rewriter", "--dtype", "bfloat16", "--max-model-len", "2048"]
