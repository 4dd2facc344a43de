"""Render bench/results/*.json as the Markdown tables in bench/README.md and docs/benchmarks.md (between the
markers).

    .venv/bin/python -m bench.report          # rewrite the tables in both pages
    .venv/bin/python -m bench.report --print  # print them instead
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from bench.common import REPO, RESULTS

PAGES = (REPO / "bench" / "README.md", REPO / "docs" / "benchmarks.md")
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _cli_row(bench: int, label: str, c: dict) -> str:
    return (f"| {bench} | {label} | C={c['concurrency']} | {c['wall_s']:.1f} s | {_pct(c['ratio_to_bound'])} of "
            f"{c['bound_s']:.1f} s |")


def summary_rows() -> list[str]:
    rows = ["| # | bench | setting | result | vs bound / target |", "|---|---|---|---|---|"]
    t = _load("teacher_throughput")
    if t:
        seq = t["sequential"]
        for r in t["in_process"]:
            rows.append(f"| 1 | teacher stage | N={t['n']}, L={t['latency_s'] * 1000:.0f} ms, C={r['concurrency']} | "
                        f"{r['wall_s']:.1f} s ({r['queries_per_s']:.0f} q/s); {r['speedup_vs_sequential']:.1f}x the "
                        f"sequential baseline ({seq['queries_per_s']:.1f} q/s; ideal {r['ideal_speedup']}x) | "
                        f"**{_pct(r['ratio_to_bound'])}** of N·L/C = {r['bound_s']:.1f} s (target ≥ 90 %) |")
        rows.append(_cli_row(1, "teacher stage, as a rule runs it (`qrewrite teacher`, new process)", t["cli"]))
    r2 = _load("rag_throughput")
    if r2:
        seq = r2["sequential"]
        for r in r2["in_process"]:
            rows.append(f"| 2 | RAG validation | N={r2['n_rows']} rows = {r2['searches']} searches, "
                        f"L={r2['latency_s'] * 1000:.0f} ms, C={r['concurrency']} | {r['wall_s']:.1f} s "
                        f"({r['searches_per_s']:.0f} searches/s); {r['speedup_vs_sequential']:.1f}x sequential "
                        f"({seq['searches_per_s']:.1f}/s; ideal {r['ideal_speedup']}x) | "
                        f"**{_pct(r['ratio_to_bound'])}** of searches·L/C = {r['bound_s']:.1f} s (target ≥ 90 %) |")
        rows.append(_cli_row(2, "RAG validation, as a rule runs it (`qrewrite validate`)", r2["cli"]))
    r3 = _load("rerun_cost")
    if r3:
        cold, warm = r3["cold"], r3["warm_median"]
        rows.append(f"| 3 | warm-cache rerun (`snakemake --forceall`, data half, openai teacher L="
                    f"{r3['latency_s'] * 1000:.0f} ms + http RAG) | cold: {cold['teacher_calls']} teacher + "
                    f"{cold['rag_calls']} RAG calls, {cold['wall_s']:.1f} s | "
                    f"warm: **{warm['paid_calls']} paid calls**, {warm['wall_s']:.1f} s | target 0 calls |")
    r4 = _load("noop_dryrun")
    if r4:
        rows.append(f"| 4 | no-op `snakemake -n` on a completed run | median of {r4['repeats']} | "
                    f"**{r4['dry_run_median_s']:.2f} s** (`snakemake --version` alone: "
                    f"{r4['snakemake_version_median_s']:.2f} s) | target < 3 s |")
    r5 = _load("reward_throughput")
    if r5:
        for prov in ("local", "http"):
            if prov in r5:
                r = r5[prov]
                rows.append(f"| 5 | reward, {prov} RAG | {r['rollouts']} rollouts, judge 30 % (L="
                            f"{r5['judge_latency_s'] * 1000:.0f} ms, {r['judge_calls']} judge calls) | cold "
                            f"**{r['rewards_per_s_cold']:.0f} rewards/s**; warm {r['rewards_per_s_warm']:.0f}/s | "
                            f"{_pct(r['ratio_to_judge_bound'])} of the judge bound {r['judge_bound_s']:.1f} s |")
    r6 = _load("e2e_stages")
    if r6:
        rows.append(f"| 6 | embedded end-to-end, target {r6['targets']} | `snakemake --cores 2`, median of "
                    f"{r6['repeats']} | **{r6['total_wall_s']:.1f} s** total | |")
    full = _load("e2e_stages_full")
    if full:
        rows.append(f"| 6 | embedded end-to-end, every stage (training + eval) | one fresh-clone `make run` | "
                    f"**{full['total_wall_s'] / 60:.1f} min** total (per stage below) | |")
    return rows


def stage_rows() -> list[str]:
    r6 = _load("e2e_stages_full") or _load("e2e_stages")
    if not r6:
        return []
    by_rule: dict[str, dict[str, float]] = defaultdict(dict)
    tenants: list[str] = []
    for name, v in r6["per_rule"].items():
        # benchmarks/{rule}.tsv, {tenant}/{rule}.tsv or {tenant}/{candidate}/{rule}.tsv (eval_rewrites, eval_generate)
        parts = name.split("/")
        tenant = parts[0] if len(parts) > 1 else "both tenants"
        rule = parts[-1] + (f" ({parts[1]})" if len(parts) > 2 else "")
        by_rule[rule][tenant] = v["s"]
        if tenant not in tenants:
            tenants.append(tenant)
    rows = ["| rule | " + " | ".join(f"{t} (s)" for t in tenants) + " |",
            "|---|" + "---|" * len(tenants)]
    for rule, vals in by_rule.items():
        rows.append(f"| {rule} | " + " | ".join(f"{vals[t]:.2f}" if t in vals else "" for t in tenants) + " |")
    return rows


def render() -> str:
    # the CPU benches' machines (a device record such as gpu_verl.json names its GPU instead: docs/gpu-check.md)
    # (a deploy check's deploy.json names its host and threads only)
    facts = [m for p in sorted(RESULTS.glob("*.json"))
             if isinstance(m := json.loads(p.read_text()).get("machine"), dict) and "cpu_model" in m]
    machines = {f"{m['cpu_model']} x{m['cpu_count']}, Python {m['python']}" for m in facts}
    parts = [f"Machine: {', '.join(sorted(machines)) or 'n/a'} (shared with other jobs while measured: compare the "
             "ratios, which are taken within one run, more than the absolute times).", "", *summary_rows()]
    stages = stage_rows()
    if stages:
        src = "one full `make run`" if _load("e2e_stages_full") else "median over repeats"
        parts += ["", f"Per stage (bench 6, {src}: the `s` column of `benchmarks/{{tenant}}/{{rule}}.tsv`):", "",
                  *stages]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true")
    args = ap.parse_args()
    table = render()
    if args.print:
        print(table)
        return
    from qrewrite.io_utils import write_text_atomic

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if BEGIN not in text or END not in text:
            sys.exit(f"{page} lacks the {BEGIN} / {END} markers")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        write_text_atomic(page, f"{head}{BEGIN}\n{table}\n{END}{tail}")
        print(f"updated {page}")

if __name__ == "__main__":
    main()
