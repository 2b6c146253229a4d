"""Small inline-SVG charts for report.html.

The report must open from disk with no network, so there is no plotting
library or CDN: each chart is a few hundred lines of SVG text built here.
Every label that came from the cluster (node names, error kinds, fault
targets) is escaped with ``html.escape``; numbers are formatted by us.
Charts take already-aggregated data (time buckets, sampled points), so
their size does not depend on how long the run was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 1100, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 160, 22, 34  # room for axis labels and the legend
#: Steps for the time axis: whole seconds, minutes or hours, so a 2.5-hour
#: axis reads 0s, 30m, 1h, ... rather than 33.3333m.
TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400)
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class Series:
    name: str
    points: list[tuple[float, float | None]]  # (x, y); y None breaks the line
    color: str = ""
    dashed: bool = False


@dataclass
class Shade:
    """A fault window: shaded from x0 to x1 and labelled at the top."""
    x0: float
    x1: float
    label: str


@dataclass
class Chart:
    title: str
    y_label: str
    x_max: float  # x runs from 0 (seconds since the run started)
    series: list[Series] = field(default_factory=list)
    points: list[tuple[float, float, str]] = field(default_factory=list)  # x, y, colour
    shades: list[Shade] = field(default_factory=list)
    log_y: bool = False
    y_min: float | None = None  # set: the axis starts here, not at zero (a slow drift shows)
    y_max: float | None = None
    height: int = HEIGHT  # px; lower for the many small charts of a drift section


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering lo..hi (1, 2, 5 times a power of ten)."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 1:
        return f"{v:.4g}"
    return f"{v:.2g}"


def time_ticks(x_max: float, n: int = 8) -> list[float]:
    """About ``n`` ticks over 0..x_max seconds, at a step from TIME_STEPS_S
    (whole days past that)."""
    if not math.isfinite(x_max) or x_max <= 0:
        return [0.0]
    raw = x_max / max(n, 1)
    step = next((s for s in TIME_STEPS_S if s >= raw), 86400 * math.ceil(raw / 86400))
    return [float(i * step) for i in range(int(x_max // step) + 1)]


def fmt_time(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:g}h"
    if s >= 120:
        return f"{s / 60:g}m"
    return f"{s:g}s"


class _Scale:
    def __init__(self, chart: Chart):
        ys = [y for s in chart.series for _, y in s.points if y is not None]
        ys += [y for _, y, _ in chart.points]
        if chart.log_y:
            ys = [y for y in ys if y > 0]
        lo = chart.y_min if chart.y_min is not None else (min(ys) if ys else 0.0)
        hi = chart.y_max if chart.y_max is not None else (max(ys) if ys else 1.0)
        if chart.log_y:
            lo = max(lo, 1e-3) if ys else 1.0
            lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(max(hi, lo * 10)))
        else:
            if chart.y_min is None:
                lo = min(lo, 0.0)  # counts and latencies read from zero
            hi = hi + 0.08 * (hi - lo) if hi > lo else lo + 1.0
        self.log, self.lo, self.hi = chart.log_y, lo, hi
        self.x_max = chart.x_max if chart.x_max > 0 else 1.0
        self.pw, self.ph = WIDTH - LEFT - RIGHT, chart.height - TOP - BOTTOM

    def x(self, v: float) -> float:
        return LEFT + self.pw * min(max(v / self.x_max, 0.0), 1.0)

    def y(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            lo, hi = math.log10(self.lo), math.log10(self.hi)
            frac = (math.log10(v) - lo) / (hi - lo)
        else:
            frac = (v - self.lo) / (self.hi - self.lo)
        return TOP + self.ph * (1 - min(max(frac, 0.0), 1.0))

    def y_ticks(self) -> list[float]:
        if self.log:
            lo, hi = round(math.log10(self.lo)), round(math.log10(self.hi))
            return [10.0 ** e for e in range(lo, hi + 1)]
        return nice_ticks(self.lo, self.hi)


def _frame(chart: Chart, sc: _Scale) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{sc.pw}" height="{sc.ph}" class="plot-bg"/>']
    for sh in chart.shades:
        x0, x1 = sc.x(sh.x0), sc.x(sh.x1)
        out.append(f'<rect class="fault" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 1.5):.1f}" '
                   f'height="{sc.ph}"><title>{escape(sh.label)}</title></rect>')
        out.append(f'<text class="fault-label" x="{x0 + 2:.1f}" y="{TOP + 10}">'
                   f'{escape(sh.label[:40])}</text>')
    for t in sc.y_ticks():
        y = sc.y(t)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + sc.pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                   f'{fmt(t)}</text>')
    for t in time_ticks(sc.x_max):
        x = sc.x(t)
        out.append(f'<text class="tick" x="{x:.1f}" y="{TOP + sc.ph + 14}" text-anchor="middle">'
                   f'{fmt_time(t)}</text>')
    out.append(f'<text class="axis" x="14" y="{TOP + sc.ph / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + sc.ph / 2:.0f})">{escape(chart.y_label)}</text>')
    out.append(f'<text class="axis" x="{LEFT + sc.pw / 2:.0f}" y="{chart.height - 4}" '
               f'text-anchor="middle">time since the run started</text>')
    return out


def _path(s: Series, sc: _Scale) -> str:
    parts: list[str] = []
    run = 0  # points in the current stretch; a lone point is drawn as a dot
    for x, y in [*s.points, (0.0, None)]:
        if y is None or (sc.log and y <= 0):
            if run == 1:
                parts.append("h0.1")
            run = 0
            continue
        parts.append(f'{"L" if run else "M"}{sc.x(x):.1f},{sc.y(y):.1f}')
        run += 1
    dash = ' stroke-dasharray="5,3"' if s.dashed else ""
    return (f'<path class="line" d="{"".join(parts)}" stroke="{s.color}"{dash}>'
            f'<title>{escape(s.name)}</title></path>') if parts else ""


def render_chart(chart: Chart) -> str:
    """One chart as an <svg> element (a string of escaped SVG)."""
    sc = _Scale(chart)
    out = [(f'<svg class="chart" viewBox="0 0 {WIDTH} {chart.height}" width="{WIDTH}" '
            f'height="{chart.height}" role="img" aria-label="{escape(chart.title)}">')]
    out += _frame(chart, sc)
    if chart.points:
        by_colour: dict[str, list[str]] = {}
        for x, y, colour in chart.points:
            if sc.log and y <= 0:
                continue
            by_colour.setdefault(colour, []).append(
                f'<circle cx="{sc.x(x):.1f}" cy="{sc.y(y):.1f}" r="1.6"/>')
        for colour, circles in by_colour.items():
            out.append(f'<g class="cloud" fill="{colour}">{"".join(circles)}</g>')
    for i, s in enumerate(chart.series):
        s.color = s.color or PALETTE[i % len(PALETTE)]
        out.append(_path(s, sc))
    for i, s in enumerate(chart.series):  # legend, right of the plot
        y = TOP + 8 + 15 * i
        out.append(f'<line x1="{WIDTH - RIGHT + 10}" x2="{WIDTH - RIGHT + 28}" y1="{y}" y2="{y}" '
                   f'stroke="{s.color}" stroke-width="2"/><text class="legend" '
                   f'x="{WIDTH - RIGHT + 32}" y="{y + 4}">{escape(s.name[:22])}</text>')
    out.append("</svg>")
    return "".join(out)


def render_strips(title: str, x_max: float,
                  rows: Sequence[tuple[str, list[tuple[float, float, str]]]],
                  shades: Sequence[Shade] = ()) -> str:
    """One horizontal strip per row (e.g. per node): (x0, x1, state) runs
    coloured by state, for health over time."""
    colours = {"ok": "#2ca02c", "down": "#d62728", "none": "#dddddd"}
    height = TOP + BOTTOM + 22 * max(len(rows), 1)
    chart = Chart(title, "", x_max)
    sc = _Scale(chart)
    sc.ph = height - TOP - BOTTOM
    out = [(f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" aria-label="{escape(title)}">')]
    for sh in shades:
        x0, x1 = sc.x(sh.x0), sc.x(sh.x1)
        out.append(f'<rect class="fault" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 1.5):.1f}" '
                   f'height="{sc.ph}"><title>{escape(sh.label)}</title></rect>')
    for i, (name, runs) in enumerate(rows):
        y = TOP + 22 * i + 3
        out.append(f'<text class="tick" x="{LEFT - 4}" y="{y + 12}" text-anchor="end">'
                   f'{escape(name[:12])}</text>')
        for x0, x1, state in runs:
            width = max(sc.x(x1) - sc.x(x0), 1)
            out.append(f'<rect x="{sc.x(x0):.1f}" y="{y}" width="{width:.1f}" '
                       f'height="16" fill="{colours.get(state, "#999")}" opacity="0.85">'
                       f'<title>{escape(name)}: {escape(state)}</title></rect>')
    for t in time_ticks(sc.x_max):
        out.append(f'<text class="tick" x="{sc.x(t):.1f}" y="{height - BOTTOM + 14}" '
                   f'text-anchor="middle">{fmt_time(t)}</text>')
    out.append(f'<text class="legend" x="{WIDTH - RIGHT + 10}" y="{TOP + 12}">green: /health 200'
               f'</text><text class="legend" x="{WIDTH - RIGHT + 10}" y="{TOP + 27}">red: not 200'
               f'</text><text class="legend" x="{WIDTH - RIGHT + 10}" y="{TOP + 42}">'
               'grey: no sample'
               f'</text></svg>')
    return "".join(out)
