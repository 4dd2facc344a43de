"""reports/index.html: one self-contained page over every tenant (inline CSS and SVG; no scripts, fonts or
images fetched, so it opens offline and can be mailed as one file).

Per tenant: the headline (judge, retrieval top-1, latency, cost), the candidate table with bootstrap
intervals, metric bars with interval whiskers, paired comparisons, training curves read from the
TensorBoard logs (SFT loss, RL reward and win rate), the data funnel from summary.json, the biggest wins
and losses side by side, and each model's lineage (code version, run, hash).
"""

from __future__ import annotations

import datetime as dt
import json
from html import escape
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_json, read_jsonl, write_text_atomic
from ..paths import eval_paths, tenant_paths
from ..runtime.release_file import RELEASE_FILE
from . import svg
from .tensorboard import read_scalars

METRIC_LABELS = {"hit_at_1": "Hit@1", "hit_at_5": "Hit@5", "mrr": "MRR", "top1": "top1 reranker",
                 "mean_top3": "mean top3", "quality": "quality q", "judge": "judge (1–5)"}
BAR_METRICS = ("hit_at_1", "hit_at_5", "mrr", "top1", "quality", "judge")
SFT_TAGS = ("train/loss", "eval/loss")
RL_REWARD_TAGS = ("qrewrite/reward_mean", "qrewrite/retrieval_term", "qrewrite/judge_term", "qrewrite/win_term")
RL_RATE_TAGS = ("qrewrite/win_rate", "qrewrite/tie_rate", "qrewrite/loss_rate")
MODEL_KEYS = ("sft_model", "sft_merged", "rl_model")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI","Noto Sans","Noto Sans CJK SC","PingFang SC",sans-serif;
margin:0;color:#1d1d1f;background:#fafafa;font-size:14px;line-height:1.45}
header{background:#22313f;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#c9d3dc;font-size:12px}nav{padding:8px 28px;background:#eef1f4;border-bottom:1px solid #dde}
nav a{margin-right:16px;color:#22313f;font-weight:600;text-decoration:none}
main{padding:8px 28px 40px;max-width:1280px}section{background:#fff;border:1px solid #e3e6ea;border-radius:8px;
padding:14px 18px;margin:18px 0}h2{margin:4px 0 10px;font-size:19px}h3{margin:16px 0 6px;font-size:15px;color:#34495e}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}th,td{border-bottom:1px solid #e6e6e6;
padding:4px 9px;text-align:right;vertical-align:top}th{background:#f3f5f7;font-weight:600}
td.l,th.l{text-align:left}.ci{color:#888;font-size:11px;white-space:nowrap}.sig{font-weight:700}.pos{color:#1e8449}.neg{color:#c0392b}
.grid{display:flex;flex-wrap:wrap;gap:10px 18px}.note{color:#666;font-size:12px;margin:4px 0}.bad{color:#b00020}
.ex td{text-align:left;max-width:260px}.ctx{color:#888;font-size:11px}.ex .q{font-weight:600}code{background:#f1f1f1;padding:1px 4px;border-radius:3px}
details{margin:6px 0}summary{cursor:pointer;font-weight:600;color:#34495e}
"""


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return escape(str(v))


def _ci_cell(m: dict, digits: int = 3) -> str:
    if m.get("mean") is None:
        return "<td>–</td>"
    return (f"<td>{_fmt(m['mean'], digits)}<br><span class=ci>[{_fmt(m['ci_low'], digits)}, "
            f"{_fmt(m['ci_high'], digits)}]</span></td>")


def _money(v) -> str:
    return "unknown" if v is None else f"${v:.4f}" if v < 1 else f"${v:.2f}"


def _latency(v) -> str:
    return "–" if v is None else f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def _colors(names: list[str]) -> dict[str, str]:
    return {n: svg.PALETTE[i % len(svg.PALETTE)] for i, n in enumerate(names)}


def headline_table(evals: dict[str, dict]) -> str:
    rows = []
    for tenant, doc in evals.items():
        for name, h in doc["headline"].items():
            rows.append(f"<tr><td class=l>{escape(tenant)}</td><td class=l>{escape(name)}</td>"
                        f"<td>{_fmt(h['judge'], 2)}</td><td>{_fmt(h['hit_at_1'])}</td><td>{_fmt(h['top1'])}</td>"
                        f"<td>{_latency(h['latency_p50_s'])}</td><td>{_latency(h['latency_p95_s'])}</td>"
                        f"<td>{_money(h['cost_per_1k_usd'])}</td></tr>")
    return ("<table><tr><th class=l>tenant</th><th class=l>candidate</th><th>judge (1–5)</th><th>Hit@1</th>"
            "<th>top1 reranker</th><th>latency p50</th><th>latency p95</th><th>cost / 1000 rewrites</th></tr>"
            + "".join(rows) + "</table>")


def release_table(evals: dict[str, dict], releases: dict[str, dict]) -> str:
    """What each tenant gets (models/T/release, chosen on validation) and how it does on test, beside pasting the
    history and the teacher: the first thing the report says."""
    rows = []
    for tenant, rel in releases.items():
        doc = evals[tenant]
        c = doc["candidates"]
        val = "; ".join(f"{escape(f['name'])} {_fmt(f['mean'])} <span class=ci>[{_fmt(f['ci_low'])}, "
                        f"{_fmt(f['ci_high'])}]</span>" for f in rel["candidates"])
        diff = (doc["comparisons"].get("release_vs_query_history") or {}).get("hit_at_1") or {}
        vs_qh = (f"{diff['diff']:+.3f} <span class=ci>[{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]</span>"
                 if diff.get("diff") is not None else "–")
        test = "".join(_ci_cell(c[n]["hit_at_1"]) if n in c else "<td>–</td>"
                       for n in ("release", "query_history", "teacher"))
        rows.append(f"<tr><td class=l>{escape(tenant)}</td><td class=l><b>{escape(rel['released']['name'])}</b>"
                    f"<br><span class=ci>{escape(rel['released']['kind'])}</span></td>{test}<td>{vs_qh}</td>"
                    f"<td class=l><span class=ci>{escape(rel['decision']['why'])}. Validation Hit@1 "
                    f"({rel['n_with_gold']} rows): {val}</span>"
                    + "".join(f"<br><b>Advice:</b> {escape(a)}" for a in rel.get("advice") or []) + "</td></tr>")
    if not rows:
        return ""
    return ("<table><tr><th class=l>tenant</th><th class=l>release</th><th>test Hit@1</th><th>query + history</th>"
            "<th>teacher</th><th>release − q+h</th><th class=l>chosen on validation</th></tr>" + "".join(rows)
            + "</table><p class=note>The release is chosen on the validation split alone (a later candidate "
            "must beat every earlier one there by more than release.margin_rows rows) and measured here on test "
            "rows it never saw. Tie-aware Hit@1 with bootstrap intervals.</p>")


def claims_table(evals: dict[str, dict]) -> str:
    """The paired comparisons behind the headline ("RL beats SFT"), one row per tenant and pair."""
    rows = []
    for tenant, doc in evals.items():
        for pair, metrics in doc["comparisons"].items():
            if not pair.startswith(("release_", "rl_", "sft_")):
                continue
            cells = []
            for m in ("judge", "hit_at_1", "quality"):
                r = metrics.get(m) or {}
                if r.get("diff") is None:
                    cells.append("<td>–</td>")
                    continue
                sig = r["ci_low"] > 0 or r["ci_high"] < 0
                cls = ("pos" if r["diff"] > 0 else "neg" if r["diff"] < 0 else "") + (" sig" if sig else "")
                cells.append(f"<td class='{cls}'>{r['diff']:+.3f} <span class=ci>[{r['ci_low']:+.3f}, "
                             f"{r['ci_high']:+.3f}] p={_fmt(r['p_value'], 3)}</span></td>")
            rows.append(f"<tr><td class=l>{escape(tenant)}</td><td class=l>{escape(pair.replace('_vs_', ' − '))}"
                        f"</td>{''.join(cells)}</tr>")
    if not rows:
        return ""
    return ("<table><tr><th class=l>tenant</th><th class=l>A − B</th><th>judge</th><th>Hit@1</th><th>quality q</th>"
            "</tr>" + "".join(rows) + "</table><p class=note>Mean paired difference with its bootstrap interval "
            "and sign-flip p-value; bold where the interval excludes 0.</p>")


def candidate_table(doc: dict) -> str:
    base = doc["baseline"]
    head = ("<tr><th class=l>candidate</th><th class=l>model</th>"
            + "".join(f"<th>{METRIC_LABELS[m]}</th>" for m in METRIC_LABELS)
            + f"<th>win / tie / loss<br>vs {escape(base)}</th><th>latency p50 / p95</th><th>cost / 1k</th>"
              "<th>errors</th></tr>")
    rows = []
    for name, c in doc["candidates"].items():
        wtl = c[f"vs_{base}"]
        rows.append(f"<tr><td class=l><b>{escape(name)}</b><br><span class=ci>{escape(c['kind'])}</span></td>"
                    f"<td class=l><span class=ci>{escape(str(c.get('model') or '–'))}</span></td>"
                    + "".join(_ci_cell(c[m], 2 if m == "judge" else 3) for m in METRIC_LABELS)
                    + f"<td>{wtl['win']} / {wtl['tie']} / {wtl['loss']}</td>"
                      f"<td>{_latency(c['latency_s']['p50'])}<br><span class=ci>{_latency(c['latency_s']['p95'])}"
                      f"</span></td><td title=\"{escape(c['cost_basis'])}\">{_money(c['cost_per_1k_usd'])}</td>"
                      f"<td>{c['errors']}</td></tr>")
    return "<table>" + head + "".join(rows) + "</table>"


def comparison_table(doc: dict) -> str:
    rows = []
    for pair, metrics in doc["comparisons"].items():
        for m, r in metrics.items():
            if r["diff"] is None:
                continue
            sig = r["ci_low"] > 0 or r["ci_high"] < 0
            cls = ("pos" if r["diff"] > 0 else "neg" if r["diff"] < 0 else "") + (" sig" if sig else "")
            rows.append(f"<tr><td class=l>{escape(pair.replace('_vs_', ' vs '))}</td><td class=l>{METRIC_LABELS[m]}</td>"
                        f"<td class='{cls}'>{r['diff']:+.3f}</td><td>[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]</td>"
                        f"<td>{_fmt(r['p_value'])}</td><td>{r['n']}</td><td>{r['a_better']} / {r['b_better']}</td></tr>")
    conf = doc["bootstrap"]["confidence"]
    return (f"<table><tr><th class=l>A vs B</th><th class=l>metric</th><th>mean A − B</th><th>{conf:.0%} bootstrap CI"
            "</th><th>p (sign-flip)</th><th>n</th><th>A better / B better</th></tr>" + "".join(rows) + "</table>"
            "<p class=note>Bold: the interval excludes 0. Paired over the same queries; intervals resample queries "
            f"({doc['bootstrap']['samples']} draws, seed {doc['bootstrap']['seed']}).</p>")


def metric_bars(doc: dict) -> str:
    names = list(doc["candidates"])
    colors = _colors(names)
    charts = []
    for m in BAR_METRICS:
        items = [{"label": n, **doc["candidates"][n][m], "color": colors[n]} for n in names]
        lo, hi = (1.0, 5.0) if m == "judge" else (0.0, 1.0)
        charts.append(svg.bars_ci(METRIC_LABELS[m], items, lo=lo, hi=hi, digits=2 if m == "judge" else 3))
    wtl = doc["baseline"]
    items = [{"label": n, "mean": doc["candidates"][n][f"vs_{wtl}"]["win_rate"], "color": colors[n]} for n in names]
    charts.append(svg.bars_ci(f"win rate vs {wtl}", items, lo=0.0, hi=1.0))
    return "<div class=grid>" + "".join(charts) + "</div>"


def curves(tenant: str) -> str:
    p = tenant_paths(tenant)
    parts = []
    for label, key, groups in (("SFT", "tb_sft", [("loss", SFT_TAGS)]),
                               ("RL", "tb_rl", [("reward", RL_REWARD_TAGS), ("rate vs teacher", RL_RATE_TAGS)])):
        d = Path(p[key])
        if not d.is_dir():
            parts.append(f"<p class=note>{label}: no TensorBoard logs at <code>{escape(str(d))}</code>.</p>")
            continue
        scalars = read_scalars(d)
        for ylabel, tags in groups:
            series = [{"name": t, "points": scalars.get(t, [])} for t in tags]
            if ylabel == "reward":  # the trend without single-step noise
                series.insert(1, {"name": f"reward_mean, rolling mean of {ROLLING}",
                                  "points": rolling_mean(scalars.get(tags[0], []), ROLLING)})
            parts.append(svg.lines(f"{label} {ylabel} ({d})", series, y_label=ylabel))
    return "<div class=grid>" + "".join(parts) + "</div>" + reward_trend_note(tenant)


ROLLING = 4


def rolling_mean(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """(step, mean of the last `window` values up to it) from the window-th point on."""
    ys = [y for _, y in points]
    return [(x, sum(ys[i + 1 - window:i + 1]) / window) for i, (x, _) in enumerate(points) if i + 1 >= window]


def reward_trend_note(tenant: str) -> str:
    """One line from stats_rl: did the RL reward rise beyond its noise (qrewrite.training.rl.summary)?"""
    path = Path(tenant_paths(tenant)["stats_rl"])
    if not path.is_file():
        return ""
    stats = json.loads(path.read_text(encoding="utf-8"))
    t = (stats.get("reward") or {}).get("trend")
    if not t:
        return ""
    harm = vs_parent_note(stats.get("vs_sft"))
    if t["rose_beyond_noise"] is None:
        verdict = (f"too few steps to tell ({t['steps']} reward steps; a verdict needs 2 per third)"
                   + (f"; last third − first third {t['rise']:+.3f}" if t["rise"] is not None else ""))
    else:
        verdict = (f"last third − first third of {t['steps']} steps: {t['rise']:+.3f} (2·SE {2 * t['se']:.3f}): "
                   + ("<b>rose beyond its noise</b>" if t["rose_beyond_noise"] else "<b>not beyond its noise</b>"))
    return f"<p class=note>RL reward trend: {verdict}.</p>{harm}"


def vs_parent_note(v: dict | None) -> str:
    """The rl stage's comparison of the RL model with its SFT parent on the validation prompts (training/rl/guard.py)."""
    if not v or not v.get("n"):
        return ""
    d = v[v["basis"]]
    verdict = ("<b class=bad>RL is worse than its SFT parent beyond noise</b>: the model was kept; prefer SFT"
               if v["worse_beyond_noise"] else "not worse than its SFT parent beyond noise")
    deg = v.get("degenerate") or {}
    loops = (f" Degenerate rewrites on validation: SFT {deg['sft']['n']}, RL {deg['rl']['n']}." if deg else "")
    return (f"<p class=note>RL vs SFT on {v['n']} validation prompts: {escape(v['basis'])} RL − SFT "
            f"{_fmt(d['diff'])} [{_fmt(d['ci_low'])}, {_fmt(d['ci_high'])}], {v['changed_rewrites']} rewrites "
            f"changed; {verdict}.{loops} What the tenant gets: the release, above.</p>")


def funnel_block(summary: dict) -> str:
    stages = summary.get("funnel") or []
    chart = svg.funnel("data funnel (rows in → out per stage)", stages)
    drops = []
    for stage, reasons in (summary.get("dropped") or {}).items():
        for reason, n in reasons.items():
            if n:
                drops.append(f"{escape(stage)}: {escape(reason)} {n}")
    r = (summary.get("retrieval") or {}).get("hit_at_1") or {}
    t = summary.get("teacher") or {}
    note = (f"<p class=note>Dropped: {'; '.join(drops) or 'none'}. Teacher {escape(str(t.get('provider')))}/"
            f"{escape(str(t.get('model')))}: {t.get('tokens')} tokens, cost {_money(t.get('cost_usd'))}. "
            f"Hit@1 over all {r.get('n')} queries: raw {_fmt(r.get('original'))} → teacher rewrite "
            f"{_fmt(r.get('rewrite'))}. Splits: {escape(json.dumps(summary.get('splits')))}.</p>")
    return chart + note


def examples_block(examples: list[dict], order: list[str]) -> str:
    by_pair: dict[str, list[dict]] = {}
    for e in examples:
        by_pair.setdefault(e["pair"], []).append(e)
    out = []
    for i, (pair, rows) in enumerate(by_pair.items()):
        body = []
        for e in rows:
            cells = "".join(
                f"<td>{escape(e['candidates'][n]['rewrite'] or '∅')}<br><span class=ctx>gold rank "
                f"{e['candidates'][n]['gold_rank'] or '–'}, q {e['candidates'][n]['quality']:.2f}, judge "
                f"{_fmt(e['candidates'][n]['judge'], 1)}</span></td>" for n in order if n in e["candidates"])
            ctx = " · ".join(x for x in (e["profile"], e["history"]) if x)
            body.append(f"<tr><td class='{'pos' if e['outcome'] == 'win' else 'neg'}'>{e['outcome']} "
                        f"{e['delta_quality']:+.2f}</td><td><span class=q>{escape(e['query'])}</span><br>"
                        f"<span class=ctx>{escape(ctx)} · gold {escape(', '.join(e['gold_doc_ids']))} · Excel row "
                        f"{e['raw_row']}</span></td>{cells}</tr>")
        head = "<tr><th>Δq</th><th>query (context)</th>" + "".join(f"<th>{escape(n)}</th>" for n in order) + "</tr>"
        out.append(f"<details{' open' if i == 0 else ''}><summary>{escape(pair.replace('_vs_', ' vs '))}: "
                   f"{sum(e['outcome'] == 'win' for e in rows)} biggest wins, {sum(e['outcome'] == 'loss' for e in rows)}"
                   f" biggest losses</summary><table class=ex>{head}{''.join(body)}</table></details>")
    return "".join(out) or "<p class=note>No wins or losses to show.</p>"


def lineage_block(tenant: str) -> str:
    rows = []
    for key in MODEL_KEYS:
        d = Path(tenant_paths(tenant)[key])
        lin = d / "lineage.json"
        if not lin.is_file():
            rows.append(f"<tr><td class=l>{escape(str(d))}</td><td class=l colspan=4>no lineage.json</td></tr>")
            continue
        doc = read_json(lin)
        code, run = doc.get("code") or {}, doc.get("run") or {}
        commit = (code.get("git_commit") or "unknown")[:12] + (" (dirty)" if code.get("dirty") else "")
        rows.append(f"<tr><td class=l><code>{escape(str(d))}</code></td><td class=l>{escape(doc['model']['rule'])}</td>"
                    f"<td class=l><code>{escape(doc['model']['sha256'][:16])}</code></td><td class=l>{escape(commit)}</td>"
                    f"<td class=l>{escape(str(run.get('started')))} ({run.get('duration_s')} s, "
                    f"{escape(str(run.get('host')))}{', Slurm ' + escape(str(run['slurm_job_id'])) if run.get('slurm_job_id') else ''})"
                    f"</td></tr>")
    return ("<table><tr><th class=l>model</th><th class=l>rule</th><th class=l>sha256</th><th class=l>code</th>"
            "<th class=l>run</th></tr>" + "".join(rows) + "</table><p class=note>Check any model with "
            "<code>qrewrite lineage verify &lt;model dir&gt;</code>; <code>qrewrite lineage show</code> prints the chain "
            "back to the raw Excel.</p>")


def signals_block(doc: dict, summary: dict) -> str:
    """Whether the signals measure what their names say (docs/signals.md): the checks against gold."""
    rows = []
    sa = ((summary.get("signals") or {}).get("score_agreement")) or {}
    if sa:
        alts = "; ".join(f"{escape(k)} {_fmt(v.get('agreement'))}" for k, v in (sa.get("alternatives") or {}).items())
        rows.append(f"<tr><td>retrieval score q agrees with gold</td><td>{_fmt(sa.get('agreement'))}</td>"
                    f"<td>{sa.get('pairs')} pairs of texts, {escape(str(sa.get('score', sa.get('provider'))))} / "
                    f"{escape(str(sa.get('quality')))}{'; other scores: ' + alts if alts else ''}</td></tr>")
    sig = doc.get("signals") or {}
    judge = sig.get("judge") or {}
    for name, res in (("judge AUC on labels derived from the data", judge.get("derived")),
                      ("judge AUC on hand-labelled rewrites", (judge.get("labelled") or {}).get("all")),
                      ("… on their held-out half (no rule tuned on it)", (judge.get("labelled") or {}).get("heldout"))):
        if res:
            kinds = "; ".join(f"{escape(k)} {_fmt(v['auc'])}" for k, v in sorted((res.get("by_failure") or {}).items()))
            rows.append(f"<tr><td>{name}</td><td>{_fmt(res.get('auc'))}</td>"
                        f"<td>{res.get('n_good')} good / {res.get('n_bad')} bad; per kind of bad: {kinds}</td></tr>")
    reward = sig.get("reward") or {}
    if reward:
        refusal = (sig.get("reward_check") or {}).get("refusal")
        rows.append(f"<tr><td>reward prefers the good rewrite</td><td>{_fmt(reward.get('preference'))}</td>"
                    f"<td>{reward.get('pairs')} derived pairs"
                    f"{'; RL refuses this reward: ' + escape(refusal) if refusal else ''}</td></tr>")
    hit = ((summary.get("retrieval") or {}).get("hit_at_1")) or {}
    if hit:
        rows.append(f"<tr><td>teacher Hit@1 (all queries)</td><td>{_fmt(hit.get('rewrite'))}</td>"
                    f"<td>raw query {_fmt(hit.get('original'))}; ties: expected value over random order</td></tr>")
    if not rows:
        return "<p class=note>No signal checks (no gold documents or labelled rewrites).</p>"
    return "<table><tr><th>check</th><th>value</th><th>detail</th></tr>" + "".join(rows) + "</table>"


def gold_block(doc: dict) -> str:
    """eval.json gold_set: every candidate on the rows a person checked, beside the checked rewrite itself."""
    g = doc.get("gold_set")
    if not g:
        return "<p class=note>No gold set (tenants[].gold_set).</p>"
    labels = {"hit_at_1": "Hit@1", "hit_at_5": "Hit@5", "mrr": "MRR", "quality": "quality q", "judge": "judge (1–5)",
              "char_f1": "char F1 vs checked", "exact_match": "exact match"}
    rows = "".join(f"<tr><td class=l><b>{escape(n)}</b></td>" + "".join(_ci_cell(c[m], 2 if m == "judge" else 3)
                                                                      for m in labels) + "</tr>"
                   for n, c in g["candidates"].items())
    return (f"<p class=note>{g['n']} queries whose rewrite a person checked ({g['n_with_gold']} with gold documents), "
            f"held out of every split; <b>{escape(g['reference'])}</b> is the checked rewrite itself.</p><table><tr>"
            "<th class=l>candidate</th>" + "".join(f"<th>{v}</th>" for v in labels.values()) + "</tr>" + rows
            + "</table>")


def red_team_block(doc: dict) -> str:
    """eval.json red_team: pass rate per candidate, overall and per attack type."""
    r = doc.get("red_team")
    if not r:
        return "<p class=note>No red-team set (tenants[].red_team).</p>"
    attacks = list(next(iter(r["candidates"].values()))["by_attack"])
    rows = "".join(f"<tr><td class=l><b>{escape(n)}</b></td><td>{c['passed']} / {c['n']} ({c['pass_rate']:.0%})</td>"
                   + "".join(f"<td>{c['by_attack'][a]['passed']} / {c['by_attack'][a]['n']}</td>" for a in attacks)
                   + "</tr>" for n, c in r["candidates"].items())
    fails = "".join(f"<li><code>{escape(f['id'])}</code> {escape(n)} ({escape(f['attack'])}): failed "
                    f"{escape(', '.join(f['failed']))} — {escape(f['rewrite'][:80] or '∅')}</li>"
                    for n, c in r["candidates"].items() for f in c["failures"])
    return (f"<p class=note>{r['n']} adversarial rows ({escape(r['use'])}); a row passes when every check of its "
            "`expect` passes (qrewrite/data/red_team.py).</p><table><tr><th class=l>candidate</th><th>passed</th>"
            + "".join(f"<th>{escape(a)}</th>" for a in attacks) + "</tr>" + rows + "</table>"
            + (f"<details><summary>failures</summary><ul>{fails}</ul></details>" if fails else ""))


def data_card_block(tenant: str) -> str:
    """Link to the dataset's card (results/T/data_card.md, relative to reports/index.html) and its headline."""
    p = tenant_paths(tenant)
    if not Path(p["data_card_json"]).is_file():
        return f"<p class=note>No data card at <code>{escape(p['data_card_json'])}</code>.</p>"
    card = read_json(p["data_card_json"])
    srcs = "; ".join(f"{escape(s['role'])} <code>{escape(s['path'])}</code> <span class=ci>{s['sha256'][:12]}</span>"
                     for s in card["sources"])
    biases = "".join(f"<li>{escape(b)}</li>" for b in card["known_biases"])
    return (f"<p>Data card: <a href='../{escape(p['data_card'])}'>{escape(p['data_card'])}</a> "
            f"(<a href='../{escape(p['data_card_json'])}'>json</a>). Sources: {srcs}.</p>"
            f"<details><summary>known biases</summary><ul>{biases}</ul></details>")


def tenant_section(tenant: str, doc: dict, examples: list[dict], summary: dict) -> str:
    j = doc["judge"]
    return (f"<section id='{escape(tenant)}'><h2>{escape(tenant)}</h2>"
            f"<p class=note>{doc['n_queries']} queries of the {escape(doc['split'])} split ({doc['n_with_gold']} with "
            f"gold documents); RAG {escape(doc['rag']['provider'])} top-{doc['rag']['top_k']}; judge "
            f"{escape(str(j['provider']))}/{escape(str(j['model']))} on {j['judged_queries']} sampled queries "
            f"(share {j['sample_share']}); baseline {escape(doc['baseline'])}.</p>"
            f"<h3>Candidates</h3>{candidate_table(doc)}"
            f"<h3>Signals checked against gold</h3>{signals_block(doc, summary)}"
            f"<h3>Metrics with {doc['bootstrap']['confidence']:.0%} intervals</h3>{metric_bars(doc)}"
            f"<h3>Paired comparisons</h3>{comparison_table(doc)}"
            f"<h3>Training curves (TensorBoard)</h3>{curves(tenant)}"
            f"<h3>Gold set (checked rewrites)</h3>{gold_block(doc)}"
            f"<h3>Red team</h3>{red_team_block(doc)}"
            f"<h3>Data</h3>{data_card_block(tenant)}{funnel_block(summary)}"
            f"<h3>Biggest wins and losses (by retrieval quality q)</h3>{examples_block(examples, list(doc['candidates']))}"
            f"<h3>Lineage</h3>{lineage_block(tenant)}</section>")


def render(cfg: dict) -> str:
    tenants = [t["name"] for t in cfg["tenants"]]
    evals, sections, releases = {}, [], {}
    for t in tenants:
        ep, tp = eval_paths(t), tenant_paths(t)
        for path in (ep["eval_json"], ep["examples"], tp["summary"]):
            if not Path(path).is_file():
                raise QrewriteError("report input not found", file=path,
                                    hint="run the eval stage for every tenant first (snakemake / dvc repro)")
        evals[t] = read_json(ep["eval_json"])
        rel = Path(tp["release"]) / RELEASE_FILE
        if rel.is_file():
            releases[t] = read_json(rel)
        sections.append(tenant_section(t, evals[t], read_jsonl(ep["examples"]), read_json(tp["summary"])))
    from ..lineage.environment import code_version

    code = code_version()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = "".join(f"<a href='#{escape(t)}'>{escape(t)}</a>" for t in tenants)
    return ("<!DOCTYPE html><html lang=zh><head><meta charset=utf-8><meta name=viewport "
            "content='width=device-width,initial-scale=1'><title>qrewrite evaluation report</title>"
            f"<style>{CSS}</style></head><body><header><h1>qrewrite: query-rewrite evaluation</h1>"
            f"<div class=meta>{len(tenants)} tenants · generated {stamp} · code "
            f"{escape(str(code.get('git_commit') or 'unknown'))[:12]}{' (dirty)' if code.get('dirty') else ''}"
            f"</div></header><nav><a href='#headline'>headline</a>{nav}</nav><main>"
            "<section id=headline><h2>What each tenant gets: the release</h2>"
            f"{release_table(evals, releases)}<h2>Headline: teacher vs release vs SFT vs RL</h2>"
            "<p class=note>Judge score (the RL reward's judge, 1–5), retrieval top-1 (Hit@1 against the gold documents, "
            "and the top1 reranker score), rewrite latency and cost per 1000 rewrites (API price table for API "
            "candidates; GPU-hour price x generation time for local models).</p>"
            f"{headline_table(evals)}{claims_table(evals)}</section>{''.join(sections)}</main></body></html>\n")


def build_report(cfg: dict, out: str) -> None:
    write_text_atomic(out, render(cfg))
