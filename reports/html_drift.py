"""report.html's drift section: per node and series (RSS, descriptors,
threads, the harness's own), the fitted slope against its bound, drawn
over the run with the fault windows shaded (invariants/drift.py judges;
this only shows)."""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import parse_iso

from .collect import MAX_WINDOWS
from .html_common import esc, figure, fmt_g, is_num
from .plots import LEFT, RIGHT, WIDTH, Chart, Series, Shade

MAX_DRIFT_SERIES = 80  # drift charts drawn; a chart is at most drift.MAX_POINTS points


DRIFT_CHART_HEIGHT = 170  # px: small, as there is one chart per node and series


HARNESS = "harness"  # the node name of the harness's own drift series


def _drift_series(summary: dict[str, Any]) -> list[tuple[str | None, list[tuple[str, str, dict]]]]:
    """The drift figures to draw, grouped by the t0 their hours count from:
    the drift invariant's nodes (summary ``invariants``), then the harness's
    own series (``endurance.harness_drift``), each group's (node, series, fit)."""
    groups: list[tuple[str | None, list[tuple[str, str, dict]]]] = []
    for inv in summary.get("invariants") or []:
        is_drift = isinstance(inv, dict) and inv.get("name") == "drift"
        details = inv.get("details") if is_drift else None
        if isinstance(details, dict) and isinstance(details.get("nodes"), dict):
            groups.append((details.get("t0_wall"), [
                (str(node), str(what), fit) for node, figs in details["nodes"].items()
                if isinstance(figs, dict) for what, fit in figs.items() if isinstance(fit, dict)]))
    endurance = summary.get("endurance")
    harness = endurance.get("harness_drift") if isinstance(endurance, dict) else None
    if isinstance(harness, dict) and harness:
        groups.append((harness.get("t0_wall"), [
            (HARNESS, what, harness[what]) for what in ("rss_mb", "fds", "threads")
            if isinstance(harness.get(what), dict)]))
    return groups


def _drift_judged(node: str, fit: dict[str, Any]) -> str:
    """Whether the invariant judged the series, or why not (its own words
    where it gave them)."""
    if node == HARNESS:
        return "harness (shown, not judged)"
    if fit.get("judged"):
        return str(fit["judged"])
    if fit.get("bound_per_h") is None:
        return "no: no bound for this series"
    return "no: too few points for a slope" if fit.get("slope_per_h") is None else "no"


def _drift_finding(fit: dict[str, Any]) -> str:
    """A finding is a judged series whose slope's lower 95% bound is above
    its bound, as the invariant decides; the same growth in a series it did
    not judge is said too, so a short run still shows it."""
    ci, bound = fit.get("ci95_per_h"), fit.get("bound_per_h")
    if not (isinstance(ci, list) and len(ci) == 2 and is_num(ci[0]) and is_num(bound)) \
            or ci[0] <= bound:
        return "no"
    return "yes" if fit.get("judged") == "yes" else "above bound, not judged"


def _drift_figures(node: str, fit: dict[str, Any]) -> str:
    """The line under a chart: slope ± interval, 72-h growth against the
    72-h bound, judged or why not (plain text, escaped by ``figure``)."""
    unit = str(fit.get("unit") or "")
    ci = fit.get("ci95_per_h")
    if fit.get("slope_per_h") is None or not isinstance(ci, list) or len(ci) != 2:
        slope = (f"{fmt_g(fit.get('points'))} points over {fmt_g(fit.get('span_h'))} h: "
                 "too few for a slope")
    else:
        slope = (f"slope {fmt_g(fit['slope_per_h'], True)} {unit}/h (95% interval "
                 f"{fmt_g(ci[0], True)} .. {fmt_g(ci[1], True)}); over 72 h "
                 f"{fmt_g(fit.get('growth_72h'), True)} {unit} "
                 f"vs bound {fmt_g(fit.get('bound_72h'))} {unit}")
    return (f"{slope} · last {fmt_g(fit.get('last'))} {unit} · "
            f"{fmt_g(fit.get('segments'))} segment(s)"
            f" · judged: {_drift_judged(node, fit)} · finding: {_drift_finding(fit)}")


def _drift_shades(faults: list[dict[str, Any]], t0: float | None, x_max: float) -> list[Shade]:
    """The fault windows (``injected`` to ``healed``, or to the chart's end
    if never healed) in seconds since the chart's t0. Windows less than two
    pixels apart merge into one shade, so a long run's hundreds of faults
    draw as a bounded number of rects."""
    if t0 is None:
        return []
    near = 2 * x_max / (WIDTH - LEFT - RIGHT)
    spans = []
    for f in faults:
        start, end = parse_iso(f.get("injected")), parse_iso(f.get("healed"))
        if start is None:
            continue
        x0, x1 = start - t0, x_max if end is None else end - t0
        if x1 >= 0 and x0 <= x_max:
            spans.append((max(x0, 0.0), min(max(x1, x0), x_max),
                          f"{f.get('kind')}@{f.get('target')}"))
    merged: list[list[Any]] = []  # x0, x1, first label, windows merged into it
    for x0, x1, label in sorted(spans):
        if merged and x0 <= merged[-1][1] + near:
            merged[-1][1] = max(merged[-1][1], x1)
            merged[-1][3] += 1
        else:
            merged.append([x0, x1, label, 0])
    return [Shade(x0, x1, label + (f" +{n} more" if n else ""))
            for x0, x1, label, n in merged[:MAX_WINDOWS]]


def _drift_chart(node: str, what: str, fit: dict[str, Any], x_max: float,
                 shades: list[Shade]) -> Chart:
    """One series on hours since t0 (drawn in seconds, the axis's unit).
    The y axis starts near the series' lowest value, not at zero: a leak of
    30 MB on a 2 GB process is the thing to see."""
    points = [(float(p[0]) * 3600, float(p[1])) for p in fit.get("chart") or []
              if isinstance(p, list) and len(p) == 2 and is_num(p[0]) and is_num(p[1])]
    ys = [y for _, y in points]
    y_min = min(ys) - 0.08 * (max(ys) - min(ys)) if ys and max(ys) > min(ys) else None
    unit = str(fit.get("unit") or "")
    return Chart(f"{node} · {what}", f"{what}, {unit}", x_max, [Series(what, points)],
                 shades=shades, y_min=y_min, height=DRIFT_CHART_HEIGHT)


def section_drift(summary: dict[str, Any]) -> str:
    """Drift over the run (issue 27): a table of every series' slope and
    verdict, then each series as a small chart with the fault windows
    shaded, so a growth can be told from a step a fault caused. Empty when
    the run has neither the drift invariant nor the harness's series."""
    groups = _drift_series(summary)
    if not groups:
        return ""
    faults = [f for f in summary.get("faults") or [] if isinstance(f, dict)]
    drift = next((i for i in summary.get("invariants") or []
                  if isinstance(i, dict) and i.get("name") == "drift"), {})
    details = drift.get("details") if isinstance(drift.get("details"), dict) else {}
    endurance = summary.get("endurance") if isinstance(summary.get("endurance"), dict) else {}
    out = ['<h2 id="drift">Drift over the run</h2>',
           ('<p class="small">Each series: bucket means with one slope per hour fitted by least '
            "squares across the run (a restart starts a new segment with its own level); a "
            "finding is a judged series whose slope's lower 95% bound is above its bound. "
            "Shaded: fault windows (injected to healed).</p>")]
    if drift:
        out.append(f"<p>drift invariant valid: <b>{esc(drift.get('valid'))}</b> · "
                   f"{esc(details.get('series_judged'))} series judged · settle "
                   f"{esc(details.get('settle_s'))} s · min span {esc(details.get('min_span_h'))} h"
                   f" · bounds per hour {esc(details.get('bounds_per_h'))}"
                   + (f" · {esc(details['why'])}" if details.get("why") else "") + "</p>")
    if endurance.get("drift"):
        out.append(f"<p>endurance: {esc(endurance['drift'])}</p>")
    rows: list[str] = []
    charts: list[str] = []
    for t0_wall, series in groups:
        t0 = parse_iso(t0_wall) if t0_wall else None
        hours = [p[0] for _, _, fit in series for p in fit.get("chart") or []
                 if isinstance(p, list) and p and is_num(p[0])]
        x_max = max(hours, default=0.0) * 3600 or 1.0
        shades = _drift_shades(faults, t0, x_max)
        for node, what, fit in series:
            i = len(rows)
            if i >= MAX_DRIFT_SERIES:
                break
            finding = _drift_finding(fit)
            ci = fit.get("ci95_per_h") if isinstance(fit.get("ci95_per_h"), list) else []
            unit = esc(fit.get("unit") or "")
            rows.append(
                f'<tr><td><a href="#drift-{i}">{esc(node)}</a></td><td>{esc(what)}</td>'
                f"<td>{esc(fmt_g(fit.get('slope_per_h'), True))} {unit}</td>"
                f"<td>{' .. '.join(esc(fmt_g(v, True)) for v in ci)}</td>"
                f"<td>{esc(fmt_g(fit.get('growth_72h'), True))} {unit}</td>"
                + (f"<td>{esc(fmt_g(fit['bound_per_h']))} {unit}/h (72 h: "
                   f"{esc(fmt_g(fit.get('bound_72h')))} {unit})</td>"
                   if fit.get("bound_per_h") is not None else "<td>none</td>")
                + f"<td>{esc(_drift_judged(node, fit))}</td>"
                + (f'<td class="valid-false">{esc(finding)}</td></tr>' if finding == "yes"
                   else f"<td>{esc(finding)}</td></tr>"))
            charts.append(f'<div id="drift-{i}">'
                          + figure(_drift_chart(node, what, fit, x_max, shades),
                                    _drift_figures(node, fit)) + "</div>")
    total = sum(len(series) for _, series in groups)
    more = (f'<p class="small">… {total - len(rows)} more series in summary.json.</p>'
            if total > len(rows) else "")
    out.append('<table id="drift-table"><tr><th>node</th><th>series</th><th>slope per h</th>'
               "<th>95% interval</th><th>growth over 72 h</th><th>bound</th><th>judged</th>"
               f"<th>finding</th></tr>{''.join(rows)}</table>{more}")
    return "".join(out + charts)
