"""Many model tenants on one CPU box: what a tenant costs the gateway. Writes bench/results/serve_tenants.json.

For N in --tenants (1, 4, 8): one gateway at its shipped defaults serving N model tenants, each a copy of a demo
tenant's release under another name (`<tenant>-copy<i>`, its release folder served with `--release`), so every
tenant has a model of its own in memory, as N tenants with N releases would. Per N: the gateway's resident memory
once every release is loaded and warmed, then after the load; latency with one request at a time, round robin over
the tenants (p50 / p95); then every tenant at concurrency 4 at once (p50 / p95, requests per second, 429s).

Beside it, the other way to hold N tenants (--adapter-check): the SFT student as base + LoRA adapter (peft,
unmerged) against the merged model, per request at batch 1 on the same rows, and the memory an extra adapter adds.

    .venvs/swift/bin/python -m bench.serve_tenants --tenant fivedoctors

after a run that released a model of the SFT student for the tenant (`make run-quick`). `--quick`: N = 1 and 2,
4 requests each (CI's smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import machine
from bench.serve_engine import rss_mb, start_gateway
from qrewrite.config import load_config, tenant_config
from qrewrite.deploy import load
from qrewrite.eval.candidates import eval_rows
from qrewrite.io_utils import write_json
from qrewrite.paths import artifact_paths, tenant_paths
from qrewrite.procs import stop_process
from qrewrite.serve.keys import key_env

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))], 4)


def copies_config(config: str, tenant: str, n: int, out: Path) -> list[str]:
    """A config whose tenants are `n` copies of `tenant` (names `<tenant>-copy<i>`); returns the names."""
    raw = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    src = next(t for t in raw["tenants"] if t["name"] == tenant)
    names = [f"{tenant}-copy{i}" for i in range(n)]
    raw["tenants"] = [{**src, "name": name} for name in names]
    out.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return names


async def round_robin(url: str, keys: dict, cfg: dict, tenants: dict, rows: list[dict], n: int) -> list[float]:
    out = []
    for i in range(n):
        name = list(tenants)[i % len(tenants)]
        res, _ = await load.run_level(url + "/v1", keys[name], cfg["serve"]["model_name"].format(tenant=name),
                                      tenants[name], [rows[i % len(rows)]], concurrency=1,
                                      max_tokens=cfg["eval"]["generation"]["max_new_tokens"], timeout_s=600)
        out += [r["latency_s"] for r in res if r["status"] == "ok"]
    return out


async def all_at_once(url: str, keys: dict, cfg: dict, tenants: dict, rows: list[dict], per: int,
                      concurrency: int) -> dict:
    start = time.perf_counter()
    runs = await asyncio.gather(*(load.run_level(
        url + "/v1", keys[name], cfg["serve"]["model_name"].format(tenant=name), t, rows[:per],
        concurrency=concurrency, max_tokens=cfg["eval"]["generation"]["max_new_tokens"], timeout_s=600)
        for name, t in tenants.items()))
    wall = time.perf_counter() - start
    res = [r for rs, _ in runs for r in rs]
    lat = [r["latency_s"] for r in res if r["status"] == "ok"]
    return {"requests": len(res), "ok": len(lat), "refused_429": sum(r["status"] == "refused" for r in res),
            "errors": sum(r["status"] == "error" for r in res),
            "fallbacks": sum(1 for r in res if r.get("fallback")), "p50_s": pct(lat, 50), "p95_s": pct(lat, 95),
            "requests_per_s": round(len(lat) / wall, 4), "per_tenant_concurrency": concurrency}


def adapter_check(cfg: dict, tenant: dict, rows: list[dict]) -> dict:
    """The SFT student merged against base + its LoRA adapter unmerged (peft), alone per request, same rows."""
    import torch
    from peft import PeftModel

    from qrewrite.runtime.generate import LocalRewriter

    paths = artifact_paths(tenant)
    gen = cfg["eval"]["generation"]
    merged = LocalRewriter(paths["sft_merged"], tenant, max_new_tokens=gen["max_new_tokens"], device="cpu",
                           dtype=gen["dtype"], trim_loops=True)
    before = rss_mb(os.getpid())
    based = LocalRewriter(paths["base_model"], tenant, max_new_tokens=gen["max_new_tokens"], device="cpu",
                          dtype=gen["dtype"], trim_loops=True)
    with_base = rss_mb(os.getpid())
    based.model = PeftModel.from_pretrained(based.model, paths["sft_model"]).eval()
    with_adapter = rss_mb(os.getpid())
    out = {}
    for name, rw in (("merged", merged), ("base+adapter", based)):
        rw.rewrite(rows[:1], batch_size=1)
        times, texts = [], []
        for r in rows:
            t0 = time.perf_counter()
            res, _ = rw.rewrite([r], batch_size=1)
            times.append(time.perf_counter() - t0)
            texts.append(res[0]["rewrite"])
        out[name] = {"median_s": round(statistics.median(times), 4), "texts": texts}
    same = sum(a == b for a, b in zip(out["merged"]["texts"], out["base+adapter"]["texts"]))
    return {"rows": len(rows), "threads": torch.get_num_threads(),
            "merged_median_s": out["merged"]["median_s"], "adapter_median_s": out["base+adapter"]["median_s"],
            "adapter_over_merged": round(out["base+adapter"]["median_s"] / out["merged"]["median_s"], 3),
            "identical_texts": same,
            "rss_mb": {"merged_model_loaded": before, "plus_base": with_base, "plus_adapter": with_adapter,
                       "one_model_mb": round(with_base - before, 1), "one_adapter_mb": round(with_adapter - with_base, 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--tenant", default="fivedoctors")
    ap.add_argument("--tenants", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=16, help="requests one at a time, round robin over the tenants")
    ap.add_argument("--per-tenant", type=int, default=8, help="requests per tenant when all ask at once")
    ap.add_argument("--adapter-check", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "serve_tenants.json"))
    args = ap.parse_args()
    if args.quick:
        args.tenants, args.requests, args.per_tenant = [1, 2], 4, 2
    os.chdir(REPO)
    cfg = load_config(args.config)
    src = tenant_config(cfg, args.tenant)
    paths = tenant_paths(args.tenant)
    rows = eval_rows(paths["test"], paths["queries"], None)
    release = artifact_paths(src)["release"]
    doc = {"bench": "serve_tenants", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "copied_release": json.loads(Path(release, "release.json").read_text())["released"]["name"],
           "serve_defaults": {k: cfg["serve"][k] for k in ("threads", "engine")}, "by_tenants": {}}
    (REPO / "bench" / "work").mkdir(exist_ok=True)  # git-ignored: the temporary configs' relative paths hold
    with tempfile.TemporaryDirectory(dir=REPO / "bench" / "work") as d:
        tmp = Path(d)
        for n in args.tenants:
            names = copies_config(args.config, args.tenant, n, tmp / f"config-{n}.yaml")
            ncfg = load_config(str(tmp / f"config-{n}.yaml"))
            tenants = {name: tenant_config(ncfg, name) for name in names}
            keys = {name: secrets.token_urlsafe(16) for name in names}
            env_keys = {key_env(cfg["serve"]["api_key_env"], name): k for name, k in keys.items()}
            started = time.perf_counter()
            proc, url = start_gateway(REPO, str(tmp / f"config-{n}.yaml"), names, {m: release for m in names},
                                      env_keys, tmp / f"gw-{n}.log")
            try:
                entry = {"startup_s": round(time.perf_counter() - started, 1), "rss_mb_loaded": rss_mb(proc.pid)}
                lat = asyncio.run(round_robin(url, keys, ncfg, tenants, rows, args.requests))
                entry["one_at_a_time"] = {"requests": args.requests, "ok": len(lat), "p50_s": pct(lat, 50),
                                          "p95_s": pct(lat, 95)}
                entry["all_at_once"] = asyncio.run(all_at_once(url, keys, ncfg, tenants, rows, args.per_tenant, 4))
                entry["rss_mb_after"] = rss_mb(proc.pid)
            finally:
                stop_process(proc)
            doc["by_tenants"][str(n)] = entry
            print(f"{n} tenants: {json.dumps(entry)}", flush=True)
    ones = doc["by_tenants"]
    if len(ones) > 1:
        lo, hi = min(ones, key=int), max(ones, key=int)
        doc["rss_mb_per_extra_tenant"] = round((ones[hi]["rss_mb_loaded"] - ones[lo]["rss_mb_loaded"])
                                               / (int(hi) - int(lo)), 1)
    if args.adapter_check:
        doc["adapter_check"] = adapter_check(cfg, src, rows[:12])
        print(json.dumps(doc["adapter_check"]), flush=True)
    write_json(args.out, doc)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
