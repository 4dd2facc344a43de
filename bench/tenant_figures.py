"""A finished run's figures per tenant, stored as bench/results/tenant_<name>.json: what the README's and the
reference pages' tenant tables are rendered from (bench/figures.py), with when, on which commit and machine, by
which command the run was made.

    .venv/bin/python -m bench.tenant_figures --tenant fivedoctors --tenant chengla --run "make run"
    .venv/bin/python -m bench.tenant_figures --tenant cqr --run "make cqr CQR_SPLIT=all" \
        --config config.yaml --config data/cqr/config.yaml

Read from the run's own files: models/T/release/release.json (what the release chose on validation, every
candidate's validation Hit@1), reports/T/eval.json (test: the release, query + history, the teacher, SFT, RL, with
intervals, and the paired differences), results/T/summary.json (the teacher's kind, its fit on every row with gold,
the split), and reports/T/deploy.json where `snakemake deploy` ran (served = eval, text for text).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import REPO, bench_args, write_result
from qrewrite.config import merged_config_files, tenant_config, tenant_teacher, validate_config
from qrewrite.paths import artifact_paths, deploy_json, eval_paths

# what each teacher kind is, in the words the README's table uses
TEACHER_KIND = {"resolve": "the embedded rule (resolve: no model)", "prf": "the embedded keyword expansion (prf)",
                "column": "people's rewrites (the sheet's column)", "openai": "an API LLM"}


def figures(cfg: dict, name: str) -> dict:
    t = tenant_config(cfg, name)
    paths = artifact_paths(t)
    release = json.loads((Path(paths["release"]) / "release.json").read_text(encoding="utf-8"))
    ev = json.loads(Path(eval_paths(name)["eval_json"]).read_text(encoding="utf-8"))
    summary_file = Path(paths["summary"])
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else None
    teacher = tenant_teacher(cfg, t)
    cand = ev["candidates"]

    def h1(c: str) -> dict | None:
        return {k: cand[c]["hit_at_1"][k] for k in ("mean", "ci_low", "ci_high", "n")} if c in cand else None

    def paired(a: str, b: str) -> dict | None:
        p = (ev["comparisons"].get(f"{a}_vs_{b}") or {}).get("hit_at_1")
        return {k: p[k] for k in ("diff", "ci_low", "ci_high", "n", "a_better", "b_better") if k in p} if p else None

    chosen = next(c for c in release["candidates"] if c["name"] == release["released"]["name"])
    qh_val = next((c for c in release["candidates"] if c["name"] == "query_history"), None)
    out = {
        "tenant": name, "language": t["language"], "student": t.get("student", "auto"),
        "teacher": {"provider": teacher["provider"], "kind": TEACHER_KIND.get(teacher["provider"]),
                    "model": (teacher.get("openai") or {}).get("model") if teacher["provider"] == "openai" else None},
        "splits": summary and summary["splits"], "with_gold": summary and summary["stages"]["split"].get("with_gold"),
        "not_trainable": summary and summary["stages"]["split"].get("not_trainable"),
        "teacher_fit": summary and summary["stages"]["validate"].get("teacher_fit"),
        "release": {"name": release["released"]["name"], "kind": release["released"]["kind"],
                    "val_hit_at_1": {k: chosen[k] for k in ("mean", "ci_low", "ci_high", "n")},
                    "val_query_history": qh_val and {k: qh_val[k] for k in ("mean", "ci_low", "ci_high", "n")},
                    "val_candidates": {c["name"]: c["mean"] for c in release["candidates"]},
                    "why": release["decision"]["why"], "margin_rows": release["decision"].get("margin_rows"),
                    "left_out": release.get("left_out")},
        "test": {c: h1(c) for c in ("release", "query_history", "teacher", "sft", "pref", "rl", "raw")},
        "test_paired": {"release_minus_query_history": paired("release", "query_history"),
                        "release_minus_teacher": paired("release", "teacher"), "rl_minus_sft": paired("rl", "sft"),
                        "pref_minus_sft": paired("pref", "sft"),
                        "sft_minus_query_history": paired("sft", "query_history"),
                        "rl_minus_query_history": paired("rl", "query_history"),
                        "pref_minus_query_history": paired("pref", "query_history")},
        "n_test": ev["n_queries"], "n_test_with_gold": ev["n_with_gold"],
    }
    dj = Path(deploy_json(name))
    if dj.is_file():
        d = json.loads(dj.read_text(encoding="utf-8"))
        out["served"] = {"texts_identical_to_eval": d.get("texts_identical_to_eval"),
                         "hit_at_1_served": d["hit_at_1"].get("served"), "hit_at_1_eval": d["hit_at_1"].get("eval"),
                         "latency_c1_p50_s": d["latency"]["1"]["latency_s"]["p50"] if "1" in d["latency"] else None,
                         "latency": {c: {"n": v["n"], "errors": v["errors"], "p50_s": v["latency_s"]["p50"],
                                         "p95_s": v["latency_s"]["p95"], "requests_per_s": v["requests_per_s"],
                                         "fallbacks": sum((v.get("fallbacks") or {}).values())}
                                     for c, v in d["latency"].items()},
                         "threads": (d.get("machine") or {}).get("threads"),
                         "measured_at": d.get("measured_at")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenant", action="append", required=True)
    ap.add_argument("--run", required=True, help="the command that made the run, as typed (e.g. 'make run')")
    ap.add_argument("--config", action="append", help="config files as the run merged them (default config.yaml)")
    ap.add_argument("--name", help="result file name after tenant_ (default the tenant's name)")
    ap.add_argument("--root", default=str(REPO), help="the project the run is in (default this checkout)")
    ap.add_argument("--commit", help="the commit the run was made at, where --root is not its checkout")
    args = bench_args(ap, quick=None)  # no quick mode: it reads a finished run
    import os

    args.results = args.results.resolve()  # before the chdir below
    os.chdir(args.root)
    files = args.config or ["config.yaml"]
    cfg = validate_config(merged_config_files(files), source=" + ".join(files))
    for name in args.tenant:
        doc = figures(cfg, name)
        path = write_result(f"tenant_{args.name or name}", {"run": args.run, "config": files, "root": args.root,
                                                            **({"run_commit": args.commit} if args.commit else {}),
                                                            **doc}, args)
        print(f"{name}: release {doc['release']['name']} test {doc['test']['release']['mean']} -> {path}")


if __name__ == "__main__":
    main()
