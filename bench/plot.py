"""A dependency-free SVG line chart for the trace benchmark: cumulative loads per request.

Why SVG by hand: the benchmark environment has no plotting library and should not need one;
a few polylines render on GitHub and in any browser, and the file is regenerated from JSON.
"""

from __future__ import annotations

from html import escape
from itertools import accumulate

WIDTH, HEIGHT = 720, 380
LEFT, RIGHT, TOP, BOTTOM = 56, 230, 20, 44
COLORS = ("#222222", "#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd")


def cumulative_loads_svg(title: str, series: list[tuple[str, str]]) -> str:
    """``series``: (label, flags) where flags has "1" for each request that loaded a model."""
    curves = [(label, list(accumulate(int(c) for c in flags))) for label, flags in series if flags]
    n = max((len(ys) for _, ys in curves), default=1)
    top = max((ys[-1] for _, ys in curves if ys), default=1) or 1
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def xy(i: int, y: int) -> str:
        return f"{LEFT + pw * (i + 1) / n:.1f},{TOP + ph * (1 - y / top):.1f}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="14" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="#888"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="#888"/>']
    step = max(1, top // 5)
    for y in range(0, top + 1, step):
        py = TOP + ph * (1 - y / top)
        out.append(f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{y}</text>')
        out.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{LEFT + pw}" y2="{py:.1f}" '
                   'stroke="#eee"/>')
    for x in range(0, n + 1, max(1, n // 6)):
        px = LEFT + pw * x / n
        out.append(f'<text x="{px:.1f}" y="{TOP + ph + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
               'request</text>')
    out.append(f'<text x="14" y="{TOP + ph / 2}" transform="rotate(-90 14 {TOP + ph / 2})" '
               'text-anchor="middle">loads so far</text>')
    for k, (label, ys) in enumerate(curves):
        color = COLORS[k % len(COLORS)]
        pts = " ".join([f"{LEFT},{TOP + ph}"] + [xy(i, y) for i, y in enumerate(ys)])
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{pts}"/>')
        ly = TOP + 14 + 18 * k
        out.append(f'<line x1="{LEFT + pw + 12}" y1="{ly - 4}" x2="{LEFT + pw + 32}" '
                   f'y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + pw + 38}" y="{ly}">{escape(label)} ({ys[-1]})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
