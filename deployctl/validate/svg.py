"""Inline SVG line charts for the report: no plotting library, no external file.

``line_chart(series, ...)`` draws each named series of (x, y) points as a polyline (class ``series``, with a
``data-series`` attribute naming it) on linear axes from 0 (or the data's minimum when below 0) to the maximum,
with tick labels at the ends and the middle.
"""
from __future__ import annotations

from html import escape
from typing import Mapping, Sequence

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
W, H, PAD_L, PAD_B, PAD_T, PAD_R = 560, 240, 64, 40, 28, 16


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def line_chart(series: Mapping[str, Sequence[tuple[float, float]]], title: str, xlabel: str, ylabel: str) -> str:
    """An <svg> element; a chart with no points says so in its body."""
    pts = [p for s in series.values() for p in s]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
           f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" font-size="12">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(0.0, min(x for x, _ in pts)), max(x for x, _ in pts)
    y0, y1 = min(0.0, min(y for _, y in pts)), max(y for _, y in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return PAD_T + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for frac in (0.0, 0.5, 1.0):
        xv, yv = x0 + frac * (x1 - x0), y0 + frac * (y1 - y0)
        out.append(f'<text x="{sx(xv):.1f}" y="{PAD_T + ph + 14}" text-anchor="middle" font-size="10">{_fmt(xv)}</text>')
        out.append(f'<text x="{PAD_L - 4}" y="{sy(yv) + 3:.1f}" text-anchor="end" font-size="10">{_fmt(yv)}</text>')
    out.append(f'<text x="{PAD_L + pw / 2}" y="{H - 6}" text-anchor="middle" font-size="11">{escape(xlabel)}</text>')
    out.append(f'<text x="12" y="{PAD_T + ph / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 12 {PAD_T + ph / 2})">{escape(ylabel)}</text>')
    for i, (name, s) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline class="series" data-series="{escape(name)}" fill="none" stroke="{colour}" '
                   f'stroke-width="1.5" points="{coords}"/>')
        out.append(f'<text x="{PAD_L + 8}" y="{PAD_T + 14 + 13 * i}" font-size="10" fill="{colour}">'
                   f'{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)
