"""The rewrite gateway (`qrewrite serve`) on a finished run's releases: its own overhead, and a bounded load test. Writes bench/results/serve_overhead.json and serve_load.json (latency and
throughput by concurrency: `snakemake deploy`'s deploy.json, stored by bench/tenant_figures.py).

* overhead: the same test rows answered by the tenant's release loaded in this process (`load_served` →
  `ServedRelease.answer`: the model's rewrite and the client step, no HTTP) and through the gateway over loopback
  (`POST /v1/rewrite`), one request at a time, in alternating blocks of one run; the ratio of median latencies is
  the gateway's cost (HTTP, JSON, keys, the access log) on top of the work it cannot skip. The rule tenant's row
  (no model) shows that cost alone in milliseconds.
* load: --load TENANT=N requests at concurrency 32, the tenants interleaved, the gateway's resident memory sampled
  every 100 requests: errors (target 0), fallbacks, memory after the warm-up, at the end and at most.

Run in the swift env (it loads the released models): `.venvs/swift/bin/python bench/serve_load.py` after `make run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_result  # noqa: E402

sys.path.insert(0, str(REPO))
from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.paths import artifact_paths, tenant_paths  # noqa: E402
from qrewrite.serve.keys import key_env  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))], 6)


async def ask(c: httpx.AsyncClient, url: str, key: str, tenant: str, row: dict) -> tuple[int, float, str | None]:
    """(HTTP status, seconds, the answer's fallback): a fallback is an answer the model did not make."""
    start = time.perf_counter()
    r = await c.post(url + "/v1/rewrite", headers={"Authorization": f"Bearer {key}"},
                     json={"tenant": tenant, **{k: row[k] for k in ("query", "profile", "history")}})
    lat = time.perf_counter() - start
    return r.status_code, lat, (r.json().get("fallback") if r.status_code == 200 else None)


async def level(url: str, keys: dict, work: list[tuple[str, dict]], concurrency: int,
                on_done=None) -> tuple[list[tuple], float]:
    sem = asyncio.Semaphore(concurrency)
    done = 0
    async with httpx.AsyncClient(timeout=600) as c:
        async def one(t, row):
            nonlocal done
            async with sem:
                out = await ask(c, url, keys[t], t, row)
            done += 1
            if on_done:
                on_done(done)
            return out
        start = time.perf_counter()
        got = await asyncio.gather(*(one(t, r) for t, r in work))
    return list(got), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--tenant", action="append", help="tenants (default: every tenant with a release)")
    ap.add_argument("--rows", type=int, default=None, help="test rows per tenant (default all)")
    ap.add_argument("--blocks", type=int, default=3, help="alternating blocks for the overhead")
    ap.add_argument("--load", action="append", metavar="TENANT=N", help="requests of the load test per tenant "
                    "(repeat; default 500 each): a rule answers in milliseconds, a model on a CPU in seconds")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.chdir(REPO)
    cfg = load_config(args.config)
    names = args.tenant or [t["name"] for t in cfg["tenants"]
                            if (Path(artifact_paths(t)["release"]) / "release.json").is_file()]
    tenants = {n: tenant_config(cfg, n) for n in names}
    rows = {n: eval_rows(tenant_paths(n)["test"], tenant_paths(n)["queries"], args.rows) for n in names}
    keys = {n: secrets.token_urlsafe(24) for n in names}
    import torch

    torch.set_num_threads(args.threads)
    from qrewrite.runtime.release import load_served

    port = 18400 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    log = REPO / "bench/results/serve_gateway.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           **{key_env(cfg["serve"]["api_key_env"], n): k for n, k in keys.items()}}
    argv = [sys.executable, "-m", "qrewrite", "serve", "--config", args.config, "--port", str(port), "--threads",
            str(args.threads), "--access-log", str(REPO / "bench/results/serve_access.jsonl"), "--timeout-s", "3600",
            *[x for n in names for x in ("--tenant", n)]]
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"the gateway exited: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        overhead = {}
        for n in names:
            served = load_served(cfg, tenants[n], artifact_paths(tenants[n])["release"])
            direct, http = [], []

            async def direct_block():
                out = []
                for r in rows[n]:
                    start = time.perf_counter()
                    await served.answer({k: r[k] for k in ("query", "profile", "history")} | {"query_id": "b"},
                                        timeout_s=600, on_backend_error="fallback")
                    out.append(time.perf_counter() - start)
                return out

            asyncio.run(level(url, keys, [(n, rows[n][0])], 1))  # warm both
            asyncio.run(direct_block())
            for _ in range(args.blocks):
                direct += asyncio.run(direct_block())
                got, _ = asyncio.run(level(url, keys, [(n, r) for r in rows[n]], 1))
                assert all(s == 200 for s, *_ in got), got
                http += [lat for _, lat, _ in got]
            asyncio.run(served.aclose())
            del served
            overhead[n] = {"release": json.loads((Path(artifact_paths(tenants[n])["release"]) / "release.json")
                                                 .read_text())["released"]["name"],
                           "requests": len(direct), "direct_p50_s": pct(direct, 50), "gateway_p50_s": pct(http, 50),
                           # a rule answers in microseconds in process: the ratio says little there, the ms do
                           "ratio_p50": round(pct(http, 50) / pct(direct, 50), 3) if pct(direct, 50) else None,
                           "gateway_minus_direct_p50_ms": round((pct(http, 50) - pct(direct, 50)) * 1000, 2)}
            print(json.dumps({"overhead": {n: overhead[n]}}), flush=True)
        write_result("serve_overhead", {"tenants": overhead, "threads": args.threads, "gateway": " ".join(argv[1:])})
        mix = dict(pair.split("=") for pair in args.load) if args.load else {n: "500" for n in names}
        plan = [n for n, k in mix.items() for _ in range(int(k))]
        random.Random(0).shuffle(plan)  # the tenants' requests interleaved, the same order every run
        seen: dict[str, int] = {}
        work = []
        for n in plan:
            work.append((n, rows[n][seen.get(n, 0) % len(rows[n])]))
            seen[n] = seen.get(n, 0) + 1
        samples = [{"done": 0, "rss_mb": rss_mb(proc.pid)}]

        def sample(done: int) -> None:
            if done % 100 == 0:
                samples.append({"done": done, "rss_mb": rss_mb(proc.pid)})
        got, wall = asyncio.run(level(url, keys, work, 32, sample))
        after_warm = [s["rss_mb"] for s in samples if s["done"] >= 200]
        lat = [x for _, x, _ in got]
        write_result("serve_load", {
            "requests": len(got), "concurrency": 32, "tenants": names, "mix": mix,
            "errors": sum(s != 200 for s, *_ in got),
            "fallbacks": sum(f is not None for *_, f in got),
            "wall_s": round(wall, 2), "requests_per_s": round(len(got) / wall, 3), "p50_s": pct(lat, 50),
            "p95_s": pct(lat, 95), "rss_mb": {"start": samples[0]["rss_mb"], "after_200": after_warm[0],
                                              "last": after_warm[-1], "max": max(after_warm)},
            "rss_growth_after_200_mb": round(after_warm[-1] - after_warm[0], 1), "samples": samples,
            "threads": args.threads})
        print(json.dumps({"load": {"errors": sum(s != 200 for s, *_ in got), "wall_s": round(wall, 1),
                                   "rss": [s["rss_mb"] for s in samples]}}), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
