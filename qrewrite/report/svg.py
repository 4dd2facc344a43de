"""Small inline SVG charts (no plotting library, no external resources): bars with interval whiskers,
line charts, the data funnel. Every function returns one `<svg>` element as a string."""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
FONT = 'font-family="system-ui, -apple-system, Segoe UI, Noto Sans, sans-serif"'


def _fmt(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def bars_ci(title: str, items: list[dict], *, lo: float = 0.0, hi: float | None = None, digits: int = 3,
            width: int = 330) -> str:
    """Horizontal bars, one per item {label, mean, ci_low, ci_high, color}; whiskers show the interval."""
    row_h, top, right = 22, 28, 56
    # the label column fits the longest label (at 11 px about 6.4 px a character): "query_history" was cut to
    # "ery_history" by a fixed 70 px; the plot keeps its width
    left = max(70, math.ceil(12 + 6.4 * max((len(it["label"]) for it in items), default=0)))
    width += left - 70
    height = top + row_h * len(items) + 22
    vals = [v for it in items for v in (it.get("mean"), it.get("ci_high")) if v is not None]
    hi = hi if hi is not None else _nice_max(max(vals, default=1.0))
    plot_w = width - left - right
    x = lambda v: left + plot_w * (min(max(v, lo), hi) - lo) / ((hi - lo) or 1.0)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'{FONT} font-size="11" role="img" aria-label="{escape(title)}">',
           f'<text x="4" y="15" font-size="12" font-weight="600">{escape(title)}</text>']
    for t in (lo, (lo + hi) / 2, hi):
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 4}" x2="{x(t):.1f}" y2="{height - 18}" stroke="#e3e3e3"/>'
                   f'<text x="{x(t):.1f}" y="{height - 6}" text-anchor="middle" fill="#777">{t:g}</text>')
    for i, it in enumerate(items):
        y = top + i * row_h
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(it["label"])}</text>')
        mean = it.get("mean")
        if mean is None:
            out.append(f'<text x="{left + 4}" y="{y + 14}" fill="#999">n/a</text>')
            continue
        out.append(f'<rect x="{x(lo):.1f}" y="{y + 4}" width="{max(x(mean) - x(lo), 1):.1f}" height="{row_h - 8}" '
                   f'fill="{it.get("color", PALETTE[0])}" opacity="0.85"><title>{escape(it["label"])}: '
                   f'{_fmt(mean, digits)} [{_fmt(it.get("ci_low"), digits)}, {_fmt(it.get("ci_high"), digits)}]'
                   f'</title></rect>')
        if it.get("ci_low") is not None and it.get("ci_high") is not None:
            a, b, cy = x(it["ci_low"]), x(it["ci_high"]), y + row_h / 2
            out.append(f'<path d="M{a:.1f},{cy:.1f}H{b:.1f}M{a:.1f},{cy - 5:.1f}V{cy + 5:.1f}M{b:.1f},{cy - 5:.1f}'
                       f'V{cy + 5:.1f}" stroke="#222" stroke-width="1.3" fill="none"/>')
        out.append(f'<text x="{width - right + 4}" y="{y + 14}">{_fmt(mean, digits)}</text>')
    out.append("</svg>")
    return "".join(out)


def lines(title: str, series: list[dict], *, width: int = 480, height: int = 220, y_label: str = "") -> str:
    """Line chart; series = [{name, points: [(x, y)], color}]. Empty series are listed as 'no data'."""
    left, right, top = 52, 12, 26
    # legend entries wrap onto as many rows as they need, below the plot
    labels = [s["name"] + ("" if s["points"] else " (no data)") for s in series]
    legend, lx, row = [], left, 0
    for label in labels:
        w = 24 + 6.2 * len(label)
        if lx + w > width and lx > left:
            lx, row = left, row + 1
        legend.append((lx, row))
        lx += w
    bottom = 34 + 15 * (row + 1)
    height += 15 * row
    pts = [p for s in series for p in s["points"]]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'{FONT} font-size="11" role="img" aria-label="{escape(title)}">',
           f'<text x="4" y="15" font-size="12" font-weight="600">{escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#999">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.08 or abs(y0) * 0.1 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom
    X = lambda v: left + pw * (v - x0) / (x1 - x0)  # noqa: E731
    Y = lambda v: top + ph * (1 - (v - y0) / (y1 - y0))  # noqa: E731
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" y1="{Y(yv):.1f}" x2="{width - right}" y2="{Y(yv):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end" fill="#777">{yv:.3g}</text>')
    for xv in sorted({x0, x1, round((x0 + x1) / 2)}):
        out.append(f'<text x="{X(xv):.1f}" y="{top + ph + 14}" text-anchor="middle" fill="#777">{xv:g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 28}" text-anchor="middle" fill="#555">step</text>')
    if y_label:
        out.append(f'<text x="12" y="{top + ph / 2}" transform="rotate(-90 12 {top + ph / 2})" '
                   f'text-anchor="middle" fill="#555">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        p = s["points"]
        if len(p) == 1:
            out.append(f'<circle cx="{X(p[0][0]):.1f}" cy="{Y(p[0][1]):.1f}" r="3" fill="{color}"/>')
        elif p:
            d = "M" + "L".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in p)
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        lx, row = legend[i]
        ly = top + ph + 40 + 15 * row
        out.append(f'<rect x="{lx:.0f}" y="{ly - 4}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{lx + 14:.0f}" y="{ly}">{escape(labels[i])}</text>')
    out.append("</svg>")
    return "".join(out)


def funnel(title: str, stages: list[dict], *, width: int = 480) -> str:
    """The data funnel: one bar per stage (rows out), the dropped share hatched, counts as text."""
    row_h, top, left, right = 26, 28, 72, 150
    height = top + row_h * len(stages) + 8
    top_n = max([s["in"] for s in stages] + [1])
    pw = width - left - right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'{FONT} font-size="11" role="img" aria-label="{escape(title)}">',
           f'<text x="4" y="15" font-size="12" font-weight="600">{escape(title)}</text>']
    for i, s in enumerate(stages):
        y = top + i * row_h
        w_in, w_out = pw * s["in"] / top_n, pw * s["out"] / top_n
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(s["stage"])}</text>'
                   f'<rect x="{left}" y="{y + 4}" width="{w_in:.1f}" height="{row_h - 8}" fill="#f4c7c3"/>'
                   f'<rect x="{left}" y="{y + 4}" width="{w_out:.1f}" height="{row_h - 8}" fill="{PALETTE[0]}"/>'
                   f'<text x="{left + pw + 6}" y="{y + 15}">{s["out"]} of {s["in"]}'
                   + (f' <tspan fill="#c0392b">(−{s["dropped"]})</tspan>' if s["dropped"] else "") + "</text>")
    out.append("</svg>")
    return "".join(out)
