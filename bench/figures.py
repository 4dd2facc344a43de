"""The figures of the README and the reference pages, rendered from the result files that measured them.

A Markdown file holds each table between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`; NAME picks a
renderer below, which reads bench/results/*.json (each written by the command that measured it: the date, the
commit and the machine are in the file) and writes the table with a line naming its sources. So a figure is in
the docs only as its result file says it, and a stale one is caught:

    .venv/bin/python bench/figures.py            # rewrite every block from the result files
    .venv/bin/python bench/figures.py --check    # exit 1 naming each block that differs (tests/test_figures.py)

Renderers: `tenants` (what each tenant gets: tenant_<name>.json), `restated` (before and after the split of
every ingested row: tenant_<name>_presplit.json and older result files beside tenant_<name>.json), `timings`
(timing_<name>.json, rc 0 only), `serving` (the deploy check's served-vs-eval and latency: tenant_<name>.json,
serve_*.json).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "notes").glob("*.md"))]
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+)(?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)",
                   re.S)

# the tenants of the tables, in order; a tenant whose result file is missing is left out of a table
TENANTS = ("fivedoctors", "chengla", "cqr", "durdev", "sights")


def load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def f3(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def ci(m: dict | None) -> str:
    if not m or m.get("mean") is None:
        return "–"
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"


def diff(p: dict | None) -> str:
    if not p or p.get("diff") is None:
        return "–"
    sign = lambda x: f"{x:+.3f}".replace("+0.000", "0.000").replace("-0.000", "0.000")  # noqa: E731
    return f"{sign(p['diff'])} [{sign(p['ci_low'])}, {sign(p['ci_high'])}]"


def source(name: str, doc: dict) -> str:
    m = doc.get("machine") or {}
    commit = doc.get("run_commit") or m.get("commit")
    units = "bf16 units" if m.get("bf16_units") else "no bf16 units" if "bf16_units" in m else "bf16 units: not recorded"
    return (f"`bench/results/{name}.json` ({(doc.get('when') or doc.get('measured_at') or '')[:10]}, commit {commit or 'not recorded'}, "
            f"{m.get('cpu_model', '?')}, {units})")


def tenants(args: str) -> str:
    names = args.split() or list(TENANTS)
    rows, sources = [], []
    for t in names:
        doc = load(f"tenant_{t}")
        if doc is None:
            continue
        rel, test, pr = doc["release"], doc["test"], doc["test_paired"]
        val_qh = rel.get("val_query_history") or {}
        rows.append(
            f"| {t} ({rel['val_hit_at_1']['n']} / {doc['n_test_with_gold']}) | {doc['teacher']['kind']} | "
            f"**{rel['name']}** ({f3(rel['val_hit_at_1']['mean'])}; query + history {f3(val_qh.get('mean'))}) | "
            f"**{ci(test['release'])}** | {f3((test.get('query_history') or {}).get('mean'))} | "
            f"{f3((test.get('teacher') or {}).get('mean'))} | {diff(pr['release_minus_query_history'])} | "
            f"{diff(pr['rl_minus_sft'])} |")
        sources.append(f"{t}: {source(f'tenant_{t}', doc)}, made by `{doc['run']}`")
    head = ("| tenant (validation / test rows with gold) | teacher | release, chosen on validation (its validation "
            "Hit@1) | release on test [95 %] | query + history, test | teacher, test | release − query + history, "
            "test [95 %] | RL − SFT, test [95 %] |\n|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *rows, "", "Sources: " + "; ".join(sources) + "." if sources else ""]).rstrip() + "\n"


def restated(args: str) -> str:
    """Each tenant's test figures before (validation and test held only rows the teacher got right) and after
    (every row of their groups). Before: tenant_<t>_presplit.json, else the newest older result file named in args
    as t=file."""
    older = dict(a.split("=", 1) for a in args.split() if "=" in a)
    rows, sources = [], []
    for t in TENANTS:
        after = load(f"tenant_{t}")
        before_name = f"tenant_{t}_presplit" if load(f"tenant_{t}_presplit") else older.get(t)
        before = load(before_name) if before_name else None
        if after is None or before is None:
            continue
        if "candidates" in before:  # a release_levers_* file: the release and the rule on test
            rel_b = next(c for c in before["candidates"] if c["released"])
            qh_b = next(c for c in before["candidates"] if c["name"] == "query_history")
            b = {"n": before["n_test_with_gold"], "release": rel_b["name"], "test": rel_b["test"],
                 "qh": qh_b["test"]["mean"], "teacher": None}
        else:
            b = {"n": before["n_test_with_gold"], "release": before["release"]["name"],
                 "test": before["test"]["release"], "qh": (before["test"].get("query_history") or {}).get("mean"),
                 "teacher": (before["test"].get("teacher") or {}).get("mean")}
        a = after
        rows.append(f"| {t} | {b['n']} → {a['n_test_with_gold']} | {b['release']} → {a['release']['name']} | "
                    f"{ci(b['test'])} → {ci(a['test']['release'])} | {f3(b['qh'])} → "
                    f"{f3((a['test'].get('query_history') or {}).get('mean'))} | {f3(b['teacher'])} → "
                    f"{f3((a['test'].get('teacher') or {}).get('mean'))} |")
        sources.append(f"{t}: before {source(before_name, before)}; after {source(f'tenant_{t}', after)}")
    head = ("| tenant | test rows with gold | release | release on test [95 %] | query + history, test | teacher, "
            "test |\n|---|---|---|---|---|---|")
    return "\n".join([head, *rows, "", "Sources: " + "; ".join(sources) + "." if sources else ""]).rstrip() + "\n"


def timings(args: str) -> str:
    names = args.split() or sorted(p.stem[len("timing_"):] for p in RESULTS.glob("timing_*.json"))
    rows, sources = [], []
    for n in names:
        doc = load(f"timing_{n}")
        if doc is None or doc.get("rc") != 0:
            continue
        m = doc.get("run_machine") or doc.get("machine") or {}
        rows.append(f"| `{doc['command']}` | **{doc['wall_min']:.1f} min** | {doc['started'][:10]} | "
                    f"{doc.get('run_commit')} | {m.get('cpu_model', '?')}, {m.get('cpu_count')} cores, "
                    f"{'bf16 units' if m.get('bf16_units') else 'no bf16 units'} | {doc.get('note') or ''} |")
        sources.append(f"`bench/results/timing_{n}.json`")
    head = "| command | wall time | date | commit | machine | note |\n|---|---|---|---|---|---|"
    return "\n".join([head, *rows, "", "Sources: " + ", ".join(sources) + "." if sources else ""]).rstrip() + "\n"


def serving(args: str) -> str:
    rows, sources = [], []
    for t in TENANTS:
        doc = load(f"tenant_{t}")
        s = (doc or {}).get("served")
        if not s:
            continue
        rows.append(f"| {t} | {doc['release']['name']} | {'yes' if s['texts_identical_to_eval'] else 'no'} | "
                    f"{f3(s['hit_at_1_served'])} / {f3(s['hit_at_1_eval'])} | {s['latency_c1_p50_s']:.2f} s |")
        sources.append(source(f"tenant_{t}", doc))
    head = ("| tenant | release | served texts = eval's, every test row | Hit@1 served / eval | p50 latency, one "
            "request at a time |\n|---|---|---|---|---|")
    out = [head, *rows]
    levels = [(t, c, v) for t in TENANTS for c, v in (((load(f"tenant_{t}") or {}).get("served") or {})
                                                     .get("latency") or {}).items()]
    if levels:
        out += ["", "| tenant | concurrency | requests | p50 | p95 | requests/s | errors | fallbacks |",
                "|---|---|---|---|---|---|---|---|"]
        for t, c, v in levels:
            out.append(f"| {t} | {c} | {v['n']} | {v['p50_s']:.3f} s | {v['p95_s']:.3f} s | {v['requests_per_s']:.2f} | "
                       f"{v['errors']} | {v['fallbacks']} |")
    over = load("serve_overhead")
    if over:
        out += ["", "| tenant | release | in process, p50 | through the gateway, p50 | ratio (difference) |",
                "|---|---|---|---|---|"]
        for t, v in over["tenants"].items():
            ratio = "–" if v["ratio_p50"] is None else f"{v['ratio_p50']:.3f}"
            out.append(f"| {t} | {v['release']} | {1000 * v['direct_p50_s']:.1f} ms | {1000 * v['gateway_p50_s']:.1f} ms "
                       f"| {ratio} ({v['gateway_minus_direct_p50_ms']:+.1f} ms) |")
        sources.append(source("serve_overhead", over))
    load_ = load("serve_load")
    if load_:
        r = load_["rss_mb"]
        mix = ", ".join(f"{t} {n}" for t, n in (load_.get("mix") or {}).items())
        out += ["", f"Load: {load_['requests']} requests ({mix}) at concurrency {load_['concurrency']}: {load_['errors']} "
                f"errors, {load_.get('fallbacks', '–')} fallbacks, {load_['requests_per_s']:.2f} requests/s; the "
                f"gateway's memory {r['after_200']:.0f} MB after 200 requests, {r['last']:.0f} MB at the end "
                f"(max {r['max']:.0f} MB)."]
        sources.append(source("serve_load", load_))
    return "\n".join([*out, "", "Sources: " + "; ".join(sources) + "." if sources else ""]).rstrip() + "\n"


def _engine_rows(name: str, doc: dict) -> list[str]:
    rows = []
    for gw, g in doc["gateways"].items():
        label = f"{gw} ({g['ref']})" if g.get("ref") else f"{gw} (commit {doc['machine'].get('commit')})"
        for c, kinds in g["levels"].items():
            for kind, v in kinds.items():
                same = f"{v['identical_to_eval']}/{v['compared']}" if "compared" in v else "–"
                fall = sum(v["fallbacks"].values()) if isinstance(v["fallbacks"], dict) else v["fallbacks"]
                rows.append(f"| {label} | {kind} | {c} | {v['n']} | {v['requests_per_s']:.2f} | "
                            f"{v['latency_s']['p50']:.3f} s | {v['latency_s']['p95']:.3f} s | {fall} | "
                            f"{v['refused_429']} | {v['errors']} | {same} |")
    return rows


def serve_engine(args: str) -> str:
    """The gateway under load at its defaults (serve_engine.json), beside a baseline gateway of another commit
    measured in the same run; `args`: other serve_engine_*.json names to add (e.g. serve_engine_threads2)."""
    names = ["serve_engine", *args.split()]
    head = ("| gateway | tenant | concurrency | requests | requests/s | p50 | p95 | fallbacks | 429s | errors | "
            "texts = eval's |\n|---|---|---|---|---|---|---|---|---|---|---|")
    out, sources = [], []
    for name in names:
        doc = load(name)
        if doc is None:
            continue
        extra = f", gateway args {' '.join(doc['gateway_args'])}" if doc.get("gateway_args") else ", shipped defaults"
        ratios = "; ".join(f"{k} {v:.2f}" for k, v in doc.get("ratios", {}).items())
        out += [f"`{name}` (the {doc['tenants']['model']} tenant's release {doc['model_release']} and a rule tenant"
                f"{extra}; ratios: {ratios}):", "", head, *_engine_rows(name, doc), ""]
        v = doc["gateways"].get("vllm-cpu")
        if v:
            out += [f"vllm-cpu: vLLM {v['vllm']} (CPU build, {v['dtype']}) behind the same gateway "
                    f"(`--backend openai`); the server took {v['startup_s']:.0f} s to start.", ""]
        sources.append(source(name, doc))
    return "\n".join([*out, "Sources: " + "; ".join(sources) + "." if sources else ""]).rstrip() + "\n"


def serve_tenants(args: str) -> str:
    doc = load("serve_tenants")
    if doc is None:
        return "\n"
    out = ["| model tenants | gateway memory, loaded | one at a time: p50 / p95 | all at once (4 each): requests/s, "
           "p50 / p95 | 429s | fallbacks |", "|---|---|---|---|---|---|"]
    for n, e in doc["by_tenants"].items():
        a, o = e["all_at_once"], e["one_at_a_time"]
        out.append(f"| {n} | {e['rss_mb_loaded']:.0f} MB | {o['p50_s']:.2f} s / {o['p95_s']:.2f} s | "
                   f"{a['requests_per_s']:.2f}, {a['p50_s']:.2f} s / {a['p95_s']:.2f} s | {a['refused_429']} | "
                   f"{a['fallbacks']} |")
    if doc.get("rss_mb_per_extra_tenant") is not None:
        out += ["", f"Each extra model tenant: {doc['rss_mb_per_extra_tenant']:.0f} MB of resident memory."]
    ad = doc.get("adapter_check")
    if ad:
        out += ["", f"The SFT student as base + LoRA adapter (peft, unmerged) against merged, alone per request on "
                f"{ad['rows']} rows: {ad['adapter_median_s']:.2f} s against {ad['merged_median_s']:.2f} s "
                f"(x{ad['adapter_over_merged']:.2f}), {ad['identical_texts']} of {ad['rows']} texts the same; an "
                f"adapter adds {ad['rss_mb']['one_adapter_mb']:.0f} MB beside a model's "
                f"{ad['rss_mb']['one_model_mb']:.0f} MB."]
    return "\n".join([*out, "", "Sources: " + source("serve_tenants", doc) + "."]).rstrip() + "\n"


def serve_summary(args: str) -> str:
    """One paragraph: what one CPU box serves at the shipped defaults (serve_engine.json, serve_tenants.json)."""
    doc = load("serve_engine")
    if doc is None:
        return "\n"
    m, eng = doc["machine"], doc["gateways"]["engine"]["levels"]
    one, hi = eng["1"]["model"], eng.get("16", eng[max(eng, key=int)])
    c = "16" if "16" in eng else max(eng, key=int)
    model, rule = hi["model"], hi["rule"]
    cores = f"{m.get('cpu_count')} {m.get('cpu_model', '?')} cores{' with bf16 units' if m.get('bf16_units') else ''}"
    text = (f"One box of {cores}, the gateway at its defaults: a model tenant ({doc['tenants']['model']}: its "
            f"{doc['model_release']}) is answered at {one['requests_per_s']:.2f} requests/s one at a time (p50 "
            f"{one['latency_s']['p50']:.2f} s) and {model['requests_per_s']:.2f} requests/s at concurrency {c} (p95 "
            f"{model['latency_s']['p95']:.2f} s, {sum(model['fallbacks'].values())} fallbacks, {model['refused_429']} "
            f"429s); a rule tenant at {rule['requests_per_s']:.0f} requests/s (p95 {1000 * rule['latency_s']['p95']:.0f} "
            f"ms).")
    ratio = doc.get("ratios", {}).get(f"model_c{c}_engine_over_baseline")
    sources = [source("serve_engine", doc)]
    if ratio:
        text += (f" The gateway before the serving engine, at its own defaults, served {ratio:.1f}x fewer requests "
                 f"per second at concurrency {c}")
        same = load("serve_engine_threads2")
        if same and same.get("ratios", {}).get(f"model_c{c}_engine_over_baseline"):
            text += (f" ({same['ratios'][f'model_c{c}_engine_over_baseline']:.1f}x fewer with both at "
                     f"{' '.join(same['gateway_args'])})")
            sources.append(source("serve_engine_threads2", same))
        text += "."
    ten = load("serve_tenants")
    if ten and ten.get("rss_mb_per_extra_tenant") is not None:
        text += (f" Each model tenant holds its model in memory: {ten['rss_mb_per_extra_tenant']:.0f} MB more per "
                 f"tenant ({max(ten['by_tenants'], key=int)} tenants measured).")
        sources.append(source("serve_tenants", ten))
    return text + "\n\nSources: " + "; ".join(sources) + ".\n"


RENDERERS = {"tenants": tenants, "restated": restated, "timings": timings, "serving": serving,
             "serve_summary": serve_summary,
             "serve_engine": serve_engine, "serve_tenants": serve_tenants}


def render_file(text: str) -> str:
    def one(m: re.Match) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise SystemExit(f"unknown figures block {name!r} (renderers: {', '.join(RENDERERS)})")
        return m.group(1) + RENDERERS[name](m.group("args").strip()) + m.group(5)

    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale block")
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default README.md and docs/*.md)")
    args = ap.parse_args(argv)
    stale = []
    for path in args.files or DOCS:
        text = path.read_text(encoding="utf-8")
        new = render_file(text)
        if new != text:
            if args.check:
                stale.append(path)
                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                           f"{path} (on disk)", f"{path} (from bench/results)"))
            else:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote the figures of {path}", file=sys.stderr)
    if stale:
        print(f"stale figures in {', '.join(map(str, stale))}: run .venv/bin/python bench/figures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
