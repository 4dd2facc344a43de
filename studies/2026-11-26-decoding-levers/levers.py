"""The student's levers: what each training or decoding setting does to the SFT student's test Hit@1
against the free baseline (query + history) and the teacher, per tenant, with paired intervals.

A lever is a name, config overrides (`--set KEY=VALUE`, any config key) and decoding variants of the same SFT
model (`--decode NAME:KEY=VALUE[,KEY=VALUE]`, extra eval candidates with their own eval.generation settings, so a
decoding lever costs generation, not training). Each run is the pipeline itself (Snakemake, the tenant's data and
teacher, SFT, eval; no RL) in a work folder `bench/work/levers-<tenant>-<lever>` (kept: another decoding variant
reuses its SFT model), and writes `bench/results/levers_<tenant>_<lever>.json`. `--table` prints every result
as the lever table of docs/training.md.

    .venv/bin/python bench/levers.py --tenant fivedoctors --lever base \\
        --decode rp12:repetition_penalty=1.2 --decode ng4:no_repeat_ngram_size=4
    .venv/bin/python bench/levers.py --tenant cqr --lever epochs3 --set train.sft.num_train_epochs=3
    .venv/bin/python bench/levers.py --table
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common import BIN, REPO, write_result

sys.path.insert(0, str(REPO / "bench"))
from rl_check import deep_merge, setting  # noqa: E402  (the same --set syntax)

from qrewrite.io_utils import read_json, write_text_atomic  # noqa: E402
from qrewrite.paths import eval_paths, tenant_paths  # noqa: E402

RESULTS = REPO / "bench" / "results"
BASE_CANDIDATES = [{"name": "raw", "kind": "raw"}, {"name": "query_history", "kind": "query_history"},
                   {"name": "teacher", "kind": "teacher"}, {"name": "sft", "kind": "model", "artifact": "sft_merged"}]


def decode_candidate(spec: str) -> dict:
    """NAME:KEY=VALUE[,KEY=VALUE] -> an eval candidate of the SFT model with those decoding settings."""
    name, _, kvs = spec.partition(":")
    gen = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in kvs.split(",") if kv)}
    return {"name": f"sft-{name}", "kind": "model", "artifact": "sft_merged", "generation": gen}


def project(work: Path, tenant: str, overrides: list[dict], decodes: list[dict]) -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    if tenant == "cqr":
        cqr = REPO / "data" / "cqr" / "config.yaml"
        if not cqr.exists():
            raise SystemExit(f"{cqr} not found: build the CQR tenant first (make cqr-data CQR_SPLIT=all)")
        cfg = deep_merge(cfg, yaml.safe_load(cqr.read_text(encoding="utf-8")))
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == tenant]
    if not cfg["tenants"]:
        raise SystemExit(f"no tenant {tenant!r} in config.yaml (or data/cqr for cqr)")
    for o in overrides:
        cfg = deep_merge(cfg, o)
    names = [c["name"] for c in BASE_CANDIDATES + decodes]
    cfg["eval"] = {**cfg.get("eval", {}), "candidates": BASE_CANDIDATES + decodes, "headline": ["sft", "teacher"],
                   "compare": [[n, b] for n in names if n.startswith("sft") for b in ("query_history", "teacher")]
                   + [[d["name"], "sft"] for d in decodes]}
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("kb", "demo", "cqr"):  # a copy: the work folder's generated files never touch the checkout's
        if (REPO / "data" / sub).is_dir():
            shutil.copytree(REPO / "data" / sub, work / "data" / sub, dirs_exist_ok=True)
    write_text_atomic(work / "config.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
    return cfg


def run(work: Path, tenant: str) -> float:
    targets = [eval_paths(tenant)["eval_json"], tenant_paths(tenant)["stats_sft"]]
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
           str(work / "config.yaml"), "--cores", "2", "--rerun-incomplete", *targets]
    t0 = time.perf_counter()
    with open(work / "snakemake.log", "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    if proc.returncode:
        raise SystemExit(f"snakemake failed ({proc.returncode}); see {work / 'snakemake.log'}")
    return round(time.perf_counter() - t0, 1)


def collect(work: Path, tenant: str, lever: str, cfg: dict, overrides: list[str], wall_s: float) -> dict:
    doc = read_json(work / eval_paths(tenant)["eval_json"])
    sft = read_json(work / tenant_paths(tenant)["stats_sft"])
    cands, comps = doc["candidates"], doc["comparisons"]
    ci = lambda m: {k: m[k] for k in ("mean", "ci_low", "ci_high", "n")}  # noqa: E731
    paired = lambda a, b: ci({**(d := comps[f"{a}_vs_{b}"]["hit_at_1"]), "mean": d["diff"]})  # noqa: E731
    out = {"tenant": tenant, "lever": lever, "set": overrides, "wall_s": wall_s, "n_test": doc["n_queries"],
           "sft_run": {k: sft.get(k) for k in ("wall_s", "steps", "stopped", "best_eval_loss", "schedule")},
           "train_sft": cfg["train"]["sft"], "candidates": {}}
    teacher = cands["teacher"]["hit_at_1"]["mean"]
    for name, c in cands.items():
        row = {"hit_at_1": ci(c["hit_at_1"])}
        if name.startswith("sft"):
            row.update(vs_query_history=paired(name, "query_history"), vs_teacher=paired(name, "teacher"),
                       x_teacher=round(c["hit_at_1"]["mean"] / teacher, 3) if teacher else None,
                       degenerate=c.get("degenerate"), with_fallback=c.get("with_fallback"),
                       generation=(c.get("generation") or {}).get("decoding_guards"))
            if name != "sft":
                row["vs_sft"] = paired(name, "sft")
        out["candidates"][name] = row
    return out


def table() -> str:
    rows = []
    for f in sorted(RESULTS.glob("levers_*.json")):
        r = json.loads(f.read_text(encoding="utf-8"))
        c = r["candidates"]
        for name, s in c.items():
            if not name.startswith("sft"):
                continue
            deg = (s.get("degenerate") or {}).get("n")
            rows.append(f"| {r['tenant']} ({r['n_test']}) | {r['lever']}{'' if name == 'sft' else ' / ' + name[4:]} "
                        f"| {c['query_history']['hit_at_1']['mean']:.3f} | {c['teacher']['hit_at_1']['mean']:.3f} "
                        f"| **{s['hit_at_1']['mean']:.3f}** | {s['vs_query_history']['mean']:+.3f} "
                        f"[{s['vs_query_history']['ci_low']:+.3f}, {s['vs_query_history']['ci_high']:+.3f}] "
                        f"| {s['x_teacher']:.2f} | {deg if deg is not None else '-'} |")
    head = ("| tenant (test rows) | lever / decoding | query + history | teacher | SFT | SFT − q+h [95 %] | "
            "× teacher | degenerate |\n|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tenant", help="fivedoctors, chengla or cqr")
    ap.add_argument("--lever", help="the lever's name (its work folder and result file)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--decode", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="a decoding variant of the same SFT model, e.g. rp12:repetition_penalty=1.2 (repeatable)")
    ap.add_argument("--table", action="store_true", help="print the lever table of every result and exit")
    args = ap.parse_args()
    if args.table:
        print(table())
        return
    if not (args.tenant and args.lever):
        ap.error("--tenant and --lever are required (or --table)")
    work = REPO / "bench" / "work" / f"levers-{args.tenant}-{args.lever}"
    decodes = [decode_candidate(d) for d in args.decode]
    cfg = project(work, args.tenant, [setting(*kv.split("=", 1)) for kv in args.set], decodes)
    wall = run(work, args.tenant)
    result = collect(work, args.tenant, args.lever, cfg, args.set, wall)
    write_result(f"levers_{args.tenant}_{args.lever}", result)
    print(json.dumps({k: result[k] for k in ("n_test", "sft_run", "candidates")}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
