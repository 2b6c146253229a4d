"""report.html: a run told at a glance, self-contained (inline CSS and SVG,
no script, no network), written beside summary.json.

Order of the page: the verdict and the invariant table (with links from
each counterexample to the ops around it), then plots over time with the
fault windows shaded, then the fault timeline and the ops around each
failure. Everything that came from the cluster or the history (model
output, error strings, node names, fault targets) is untrusted text and
goes through ``html.escape``; only whitelisted fields of ops are shown.

``render_report`` never raises: a damaged summary or history gives a page
that shows what could be read and says what was wrong, because it runs at
the end of a harness whose evidence matters more than the page.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from ordeal.history.ops import parse_iso

from .collect import MAX_WINDOWS, NODE_METRICS, ReportData, collect
from .findings import bounds_text
from .plots import LEFT, RIGHT, WIDTH, Chart, Series, Shade, render_chart, render_strips

REPORT_NAME = "report.html"
MAX_FIGURES = 8  # key figures shown per invariant
MAX_CX = 5  # counterexamples shown per invariant
MAX_DRIFT_SERIES = 80  # drift charts drawn; a chart is at most drift.MAX_POINTS points
DRIFT_CHART_HEIGHT = 170  # px: small, as there is one chart per node and series
HARNESS = "harness"  # the node name of the harness's own drift series

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{margin-top:32px;border-bottom:1px solid #ccc}
.verdict{display:inline-block;padding:6px 16px;border-radius:6px;font-size:24px;font-weight:bold;
 color:#fff;margin:8px 0} .v-pass{background:#2ca02c} .v-fail{background:#d62728}
.v-unknown{background:#e69500}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;
 vertical-align:top;text-align:left} th{background:#f3f3f3}
.valid-true{color:#2ca02c;font-weight:bold} .valid-false{color:#d62728;font-weight:bold}
.valid-unknown{color:#e69500;font-weight:bold}
.scope{background:#fff8e6;border:1px solid #e69500;padding:4px 12px;margin:8px 0}
.problems{background:#fff3f3;border:1px solid #d62728;padding:8px 12px;margin:12px 0}
.mono,pre{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;
 word-break:break-all} .focus{background:#fff0c0} .small{color:#666;font-size:12px}
svg.chart{display:block;margin:6px 0 18px;max-width:100%;height:auto}
.plot-bg{fill:#fafafa;stroke:#ccc} .grid{stroke:#e6e6e6} .tick,.legend{font-size:11px;fill:#444}
.axis{font-size:12px;fill:#222} .line{fill:none;stroke-width:1.6;stroke-linecap:round}
.fault{fill:#d62728;fill-opacity:.12} .fault-label{font-size:10px;fill:#a00}
.cloud{fill-opacity:.45}
"""


def load_summary(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """summary.json as a dict, or ({}, why it could not be read)."""
    path = run_dir / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, f"{path} is missing"
    except (OSError, ValueError) as e:
        return {}, f"{path} is damaged: {type(e).__name__}: {e}"
    if not isinstance(data, dict):
        return {}, f"{path} is damaged: not a JSON object"
    return data, None


def _e(v: Any, cap: int = 400) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return escape(s if len(s) <= cap else s[:cap] + " …")


def _valid_cell(v: Any) -> str:
    name = {True: "true", False: "false"}.get(v, "unknown") if isinstance(v, bool) or v is None \
        else ("unknown" if str(v) == "unknown" else _e(v))
    return f'<td class="valid-{name}">{name}</td>'


def _figures(details: Any) -> str:
    """Scalar top-level details, the figures a person reads first."""
    if not isinstance(details, dict):
        return _e(details)
    items = [(k, v) for k, v in details.items()
             if isinstance(v, (str, int, float, bool)) or v is None][:MAX_FIGURES]
    lists = [(k, v) for k, v in details.items() if isinstance(v, list) and v][:2]
    parts = [f"{_e(k)}={_e(v, 120)}" for k, v in items + lists]
    return "<br>".join(parts) or '<span class="small">(see summary.json)</span>'


def _counterexamples(cxs: Any, linked: set[int]) -> str:
    if not isinstance(cxs, list) or not cxs:
        return ""
    rows = []
    for cx in cxs[:MAX_CX]:
        if not isinstance(cx, dict):
            rows.append(_e(cx, 200))
            continue
        idx = cx.get("index")
        label = f"op {idx}" if isinstance(idx, int) else "op ?"
        ref = (f'<a href="#op-{idx}">{escape(label)}</a>' if isinstance(idx, int) and idx in linked
               else escape(label))
        rest = {k: v for k, v in cx.items() if k not in ("index", "problem")}
        rows.append(f'{ref}: {_e(cx.get("problem", ""), 200)} '
                    f'<span class="mono">{_e(rest, 300)}</span>')
    more = f"<br>… {len(cxs) - MAX_CX} more in summary.json" if len(cxs) > MAX_CX else ""
    return "<br>".join(rows) + more


def _scope(summary: dict[str, Any]) -> str:
    """Right under the verdict: what it does not cover (issue 47), each
    invariant left out with why, and those ``--require-judged`` named."""
    scope = summary.get("scope") if isinstance(summary.get("scope"), dict) else {}
    left = scope.get("not_judged") if isinstance(scope.get("not_judged"), dict) else {}
    if not left:
        return ""
    rows = "".join(
        f"<li><b>{_e(name)}</b>{' (required by --require-judged)' if v.get('required') else ''}"
        f": {_e(v.get('why', ''), 300)}</li>"
        for name, v in left.items() if isinstance(v, dict))
    return (f'<div class="scope" id="scope"><p><b>Scope: {len(left)} invariant(s) not judged '
            f"on this cluster</b>; the verdict covers the other "
            f"{len(scope.get('judged') or [])}:</p><ul>{rows}</ul></div>")


def section_head(summary: dict[str, Any], data: ReportData | None, problems: list[str]) -> str:
    verdict = str(summary.get("verdict", "unknown"))
    css = verdict if verdict in ("pass", "fail") else "unknown"
    ops = summary.get("ops") if isinstance(summary.get("ops"), dict) else {}
    cluster = summary.get("cluster") if isinstance(summary.get("cluster"), dict) else {}
    wl = summary.get("workload") if isinstance(summary.get("workload"), dict) else {}
    out = [f"<h1>Ordeal run {_e(summary.get('run_id', '(unknown run)'))}</h1>",
           f'<div class="verdict v-{css}" id="verdict">Verdict: {escape(verdict.upper())}</div>',
           _scope(summary),
           (f'<p>suite <b>{_e(summary.get("suite", "?"))}</b> · started '
            f'{_e(summary.get("started", "?"))} · ended {_e(summary.get("ended", "?"))} · backend '
            f'{_e(cluster.get("backend", "?"))} · engine {_e(cluster.get("engine", "?"))}</p>'),
           _timing(summary),
           "<p>ops: " + " · ".join(f"{_e(k)} {_e(v)}" for k, v in ops.items()) + "</p>"]
    if wl:
        keys = ("mode", "rate", "duration_s", "concurrency", "stream_share", "seed")
        out.append('<p class="small">workload: ' + " · ".join(
            f"{k} {_e(wl[k])}" for k in keys if k in wl) + "</p>")
    nodes = [n for n in cluster.get("nodes") or [] if isinstance(n, dict)]
    if nodes:  # no URLs: they may carry credentials on a real cluster
        out.append("<table><tr><th>node</th><th>role</th><th>fingerprint</th></tr>" + "".join(
            f"<tr><td>{_e(n.get('name'))}</td><td>{_e(n.get('role'))}</td>"
            f"<td>{_e(n.get('fingerprint'))}</td></tr>" for n in nodes) + "</table>")
    out.append(_stack(cluster, nodes))
    errs = [str(e) for e in summary.get("errors") or []]
    if errs or problems:
        out.append('<div class="problems" id="problems"><b>Problems</b><ul>' + "".join(
            f"<li>run error: {_e(e, 1000)}</li>" for e in errs[:30]) + "".join(
            f"<li>report: {_e(p, 1000)}</li>" for p in problems[:60]) + "</ul></div>")
    return "".join(out)


def _hms(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "?"
    t = int(max(0, v))
    return f"{t // 3600}:{t % 3600 // 60:02d}:{t % 60:02d}"


def _timing(summary: dict[str, Any]) -> str:
    """How long the whole run ran (summary ``duration_s``) and, for a
    resumed run, each segment and the gaps between them (``segments``)."""
    segs = [s for s in summary.get("segments") or [] if isinstance(s, dict)]
    if summary.get("duration_s") is None and len(segs) < 2:
        return ""
    out = f'<p class="small" id="timing">ran {_hms(summary.get("duration_s"))} (monotonic clock)'
    if len(segs) < 2:
        return out + "</p>"
    out += (f" over {len(segs)} segments: resumed {len(segs) - 1} time(s), down "
            f"{_hms(summary.get('down_s'))} between them (not counted)</p>"
            "<table><tr><th>segment</th><th>started</th><th>ended</th><th>ran</th>"
            "<th>resumed after a gap</th></tr>")
    for i, seg in enumerate(segs):
        gap = seg.get("resumed_from_gap") if isinstance(seg.get("resumed_from_gap"), dict) else {}
        out += (f"<tr><td>{i + 1}</td><td>{_e(seg.get('started'))}</td>"
                f"<td>{_e(seg.get('ended'))}</td><td>{_hms(seg.get('duration_s'))}</td><td>"
                + (f"down {_hms(gap.get('down_s'))} (last op {_e(gap.get('from'))})" if gap
                   else "") + "</td></tr>")
    return out + "</table>"


def _stack(cluster: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    """The stack under test, as Ordeal ran it: the model, the settings and
    who chose them, and every node's exact command."""
    model = cluster.get("model") if isinstance(cluster.get("model"), dict) else {}
    stack = cluster.get("stack") if isinstance(cluster.get("stack"), dict) else {}
    if not model and not stack:
        return ""
    parts = []
    if model:
        size = model.get("size_bytes")
        parts.append(f"model <b>{_e(model.get('name'))}</b> ({_e(model.get('source', '?'))}, "
                     f"{_e(', '.join(model.get('architectures') or []) or '?')}"
                     + (f", {size / 1e6:.1f} MB" if isinstance(size, (int, float)) else "")
                     + f", config {_e(str(model.get('config_sha256') or '?')[:12])})")
    for key in ("served_model_name", "router_profile", "engine_args", "engine_env",
                "router_args", "ordeal_engine_flags", "router_profile_flags"):
        if key in stack:
            parts.append(f"{_e(key)} <span class=\"mono\">{_e(stack[key], 400)}</span>")
    commands = "".join(f"<li><b>{_e(n.get('name'))}</b> <span class=\"mono\">"
                       f"{_e(' '.join(n.get('command') or []), 2000)}</span></li>"
                       for n in nodes if n.get("command"))
    return ('<p class="small" id="stack">stack: ' + " · ".join(parts) + "</p>"
            + (f"<details><summary>every node's command</summary><ul>{commands}</ul></details>"
               if commands else ""))


def section_findings(summary: dict[str, Any]) -> str:
    """What the system did wrong, first (summary.json ``findings``)."""
    found = [f for f in summary.get("findings") or [] if isinstance(f, dict)]
    if not found:
        return ""
    items = []
    for f in found:
        known = f.get("known")
        tag = (f'<span class="valid-unknown">known</span> ({_e("; ".join(map(str, known)), 300)}): '
               if known else '<span class="valid-false">new</span>: ')
        examples = ", ".join(
            (f'<a href="#op-{e["index"]}">op {e["index"]}</a>' if isinstance(e.get("index"), int)
             else _e(e.get("window"))) for e in f.get("examples") or [] if isinstance(e, dict))
        figures = " · ".join(f"{_e(k)}={_e(v, 80)}" for k, v in (f.get("figures") or {}).items())
        # A known finding's bounds beside the worst figure it covered, or the
        # figure beyond a known finding's bound that made it new.
        sizes = [*(f"within its bounds: {b}" for b in f.get("known_bounds") or [] if known),
                 *(f"beyond a known finding: {b}" for b in f.get("beyond_known") or [])]
        items.append(f"<li>{tag}<b>{_e(f.get('invariant'))}</b>: {_e(f.get('what'), 400)}"
                     + "".join(f'<br><span class="small bounds">{_e(b, 400)}</span>'
                               for b in sizes[:4])
                     + f'<br><span class="small">{figures}</span>'
                     + (f'<br><span class="small">examples: {examples}</span>' if examples else "")
                     + (f'<br><span class="mono">replay: {_e(f.get("replay"), 400)}</span>'
                        if f.get("replay") else "") + "</li>")
    return f'<h2 id="findings">Findings</h2><ul>{"".join(items)}</ul>'


def section_invariants(summary: dict[str, Any], data: ReportData | None) -> str:
    invs = [i for i in summary.get("invariants") or [] if isinstance(i, dict)]
    if not invs:
        return "<h2>Invariants</h2><p>No invariant results in summary.json.</p>"
    linked = {c.index for c in data.contexts} if data else set()
    rows = "".join(
        f"<tr><td>{_e(i.get('name'))}</td>{_valid_cell(i.get('valid'))}"
        f"<td>{_known(i.get('known'), i.get('beyond_known'))}{_figures(i.get('details'))}</td>"
        f"<td>{_counterexamples(i.get('counterexamples'), linked)}</td></tr>" for i in invs)
    return ('<h2>Invariants</h2><table id="invariants"><tr><th>invariant</th><th>valid</th>'
            f"<th>key figures</th><th>counterexamples</th></tr>{rows}</table>"
            + _known_findings(summary.get("known_findings")))


def _known(findings: Any, beyond: Any = None) -> str:
    """A failure the known-findings file covers: said first, with why and
    its bounds beside the worst figure covered; or the windows a known
    finding names whose figure was beyond its bound (a new finding)."""
    out = "".join(f'<p class="known"><b>known finding</b> (not in the verdict): '
                  f"{_e(f.get('reason'))}; tracked: {_e(f.get('tracked'))}; "
                  f"within its bounds: {_e(bounds_text(f), 300)}</p>"
                  for f in findings if isinstance(f, dict)) if isinstance(findings, list) else ""
    return out + "".join(f'<p class="known"><b>beyond a known finding</b> (in the verdict): '
                         f"{_e(b.get('window'))}: {_e(bounds_text(b), 300)}; the finding: "
                         f"{_e(b.get('reason'))}</p>"
                         for b in (beyond if isinstance(beyond, list) else [])
                         if isinstance(b, dict))


def _known_findings(known: Any) -> str:
    if not isinstance(known, dict):
        return ""
    not_seen = "".join(f"<li>{_e(f.get('invariant'))} under {_e(f.get('fault'))}@"
                       f"{_e(f.get('target'))}: {_e(f.get('reason'))}</li>"
                       for f in known.get("not_seen") or [] if isinstance(f, dict))
    matched = "".join(f"<li>{_e(f.get('invariant'))} under {_e(f.get('fault'))}@"
                      f"{_e(f.get('target'))}: {_e(f.get('violations'))} violation(s), "
                      f"{_e(bounds_text(f), 300)}</li>"
                      for f in known.get("matched") or [] if isinstance(f, dict))
    beyond = [b for b in known.get("beyond") or [] if isinstance(b, dict)]
    return (f'<p class="small" id="known-findings">known findings: {_e(known.get("file"))} '
            f"({_e(known.get('chosen_by'))}), {len(known.get('matched') or [])} matched"
            + (f", each within its bounds:<ul>{matched}</ul>" if matched else "")
            + (f"; {len(beyond)} window(s) beyond a finding's bounds (new findings: see "
               "the invariants)" if beyond else "")
            + (f"; listed but not seen although their fault was injected:<ul>{not_seen}</ul>"
               if not_seen else "") + "</p>")


def _shades(data: ReportData) -> list[Shade]:
    return ([Shade(s, e, "warm-up") for s, e in data.warmups]
            + [Shade(s, e if e is not None else data.span_s, label)
               for s, e, label in data.windows])


def _charts(data: ReportData) -> list[str]:
    w = data.width_s
    n = int(max(data.span_s, w) // w) + 1
    x_max = n * w
    xs = [(i + 0.5) * w for i in range(n)]
    bs = [data.buckets.get(i) for i in range(n)]
    shades = _shades(data)

    def per_bucket(get: Any) -> list[tuple[float, float | None]]:
        return [(x, get(b) if b is not None else None) for x, b in zip(xs, bs)]

    def counts(get: Any) -> list[tuple[float, float | None]]:
        # an empty bucket inside the run is zero requests, not a gap
        return [(x, get(b) if b is not None else 0.0) for x, b in zip(xs, bs)]

    def q(metric: str, p: float) -> Any:
        return lambda b: getattr(b, metric).quantile(p)

    out = []
    lat = Chart("Latency (ms)", "latency, ms (log)", x_max, shades=shades, log_y=True)
    for metric, label, colour in (("ttft", "TTFT", "#c85a00"), ("e2e", "E2E", "#0b4f8a")):
        lat.series.append(Series(f"{label} p50", per_bucket(q(metric, 0.5)), colour))
        lat.series.append(Series(f"{label} p99", per_bucket(q(metric, 0.99)), colour, True))
    lat.points = [(x, e2e, "#1f77b4") for x, e2e, _, _ in data.cloud]
    lat.points += [(x, ttft, "#ff7f0e") for x, _, ttft, _ in data.cloud if ttft is not None]
    out.append(_figure(lat, f"per {w:g} s bucket by invoke time; dots: a sample of "
                            f"{len(data.cloud)} of {data.seen_requests} requests (blue E2E, "
                            "orange TTFT)"))
    itl = Chart("Inter-token latency (ms)", "ITL, ms (log)", x_max, shades=shades, log_y=True)
    itl.series = [Series("ITL p50", per_bucket(q("itl", 0.5)), "#6a3d9a"),
                  Series("ITL p99", per_bucket(q("itl", 0.99)), "#6a3d9a", True)]
    out.append(_figure(itl, "between streamed chunks, as vllm bench serve defines ITL"))
    rate = Chart("Throughput and goodput", "requests/s", x_max, shades=shades)
    rate.series = [Series("ok/s", counts(lambda b: b.ok / w), "#1f77b4", True),
                   Series("goodput/s (within SLO)", counts(lambda b: b.good / w), "#2ca02c"),
                   Series("fail/s", counts(lambda b: b.fail / w), "#d62728"),
                   Series("info/s (unknown)", counts(lambda b: b.info / w), "#e69500")]
    out.append(_figure(rate, "by completion time"))
    kinds = sorted({k for b in bs if b for k in b.errors})
    errs = Chart("Errors and unknown outcomes by kind", "requests/s", x_max, shades=shades)
    errs.series = [Series(f"{t}: {k}", counts(lambda b, key=(t, k): b.errors.get(key, 0) / w))
                   for t, k in kinds]
    out.append(_figure(errs, "fail = certainly did not run; info = outcome unknown"
                       if kinds else "no failed or unknown requests"))
    out.append("<h3>Per-node health and engine metrics</h3>")
    if data.nodes:
        carry = max(1, int(6.0 // w))  # buckets a sample stands for
        rows = []
        for node in data.nodes:
            runs: list[tuple[float, float, str]] = []
            last, since = "none", 0
            for i, b in enumerate(bs):
                if b is not None and node in b.health:
                    last, since = ("ok" if b.health[node] else "down"), i
                # samples come every few seconds: hold the last one that long
                state = last if i - since <= carry else "none"
                if runs and runs[-1][2] == state:
                    runs[-1] = (runs[-1][0], (i + 1) * w, state)
                else:
                    runs.append((i * w, (i + 1) * w, state))
            rows.append((node, runs))
        out.append(render_strips("/health per node", x_max, rows, shades))
    gpus = getattr(data, "gpus", [])
    for label in [*NODE_METRICS, *sorted(data.gpu_keys)]:
        # samples are sparser than buckets: join them rather than break at each gap
        who = data.nodes if label in NODE_METRICS else [*data.nodes, *gpus]
        series = [Series(node, [(x, y) for x, y in per_bucket(
            lambda b, n=node, m=label: b.nodes.get(n, {}).get(m)) if y is not None])
            for node in who]
        if any(y is not None for s in series for _, y in s.points):
            note = ("min per bucket of NVML readings (a throttle shows as a dip)"
                    if label.endswith("clock_mhz") else "max per bucket of the monitor's samples")
            if label == "gpu clocks_event_reasons":
                note += "; bits: 0x1 GpuIdle, 0x4 SwPowerCap, 0x8 HwSlowdown, 0x20 SwThermal, " \
                        "0x40 HwThermal, 0x80 PowerBrake"
            out.append(_figure(Chart(label, label, x_max, series, shades=shades), note))
    if not data.gpu_keys:
        why = getattr(data, "gpu_note", None) or "no GPU on this cluster"
        out.append(f'<p class="small">GPU telemetry: none ({escape(why)}).</p>')
    return out


def _figure(chart: Chart, note: str) -> str:
    return (f"<h3>{escape(chart.title)}</h3>{render_chart(chart)}"
            f'<p class="small">{escape(note)}</p>')


def section_plots(data: ReportData | None) -> str:
    if data is None or data.t0_ns is None:
        return "<h2>Over time</h2><p>No ops could be read from history.jsonl.</p>"
    dropped = (f" {data.windows_dropped} later fault windows are not drawn."
               if data.windows_dropped else "")
    warm = " and the warm-up (not judged as steady state)" if data.warmups else ""
    return (f'<h2 id="plots">Over time</h2><p class="small">{data.ops_read} ops over '
            f"{data.span_s:.1f} s in {data.width_s:g} s buckets; shaded: fault windows "
            f"(inject begin to heal end){warm}.{dropped}</p>" + "".join(_charts(data)))


def section_faults(summary: dict[str, Any], data: ReportData | None) -> str:
    faults = [f for f in summary.get("faults") or [] if isinstance(f, dict)]
    out = ["<h2>Fault timeline</h2>"]
    if faults:
        out.append("<table><tr><th>kind</th><th>target</th><th>injected</th><th>healed</th>"
                   "<th>inject</th><th>heal</th><th>error</th></tr>")
        for f in faults[:300]:
            out.append(f"<tr><td>{_e(f.get('kind'))}</td><td>{_e(f.get('target'))}</td>"
                       f"<td>{_e(f.get('injected'))}</td><td>{_e(f.get('healed'))}</td>"
                       f'<td class="mono">{_e(f.get("inject_result"), 300)}</td>'
                       f'<td class="mono">{_e(f.get("heal_result"), 300)}</td>'
                       f"<td>{_e(f.get('error') or '')}</td></tr>")
        out.append("</table>")
    elif data and data.windows:
        out.append("<table><tr><th>window</th><th>from (s)</th><th>to (s)</th></tr>" + "".join(
            f"<tr><td>{_e(lbl)}</td><td>{s:.1f}</td><td>{'' if e is None else f'{e:.1f}'}</td></tr>"
            for s, e, lbl in data.windows) + "</table>")
    else:
        out.append("<p>No faults were injected in this run.</p>")
    return "".join(out)


def _num(v: Any) -> bool:
    """A finite number (not a bool): summary.json may be damaged or hand-edited."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _g(v: Any, sign: bool = False) -> str:
    """A figure as text: numbers short (with a sign for slopes), the rest as written."""
    if _num(v):
        return f"{v:+.4g}" if sign else f"{v:.4g}"
    return "none" if v is None else str(v)


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
    if not (isinstance(ci, list) and len(ci) == 2 and _num(ci[0]) and _num(bound)) \
            or ci[0] <= bound:
        return "no"
    return "yes" if fit.get("judged") == "yes" else "above bound, not judged"


def _drift_figures(node: str, fit: dict[str, Any]) -> str:
    """The line under a chart: slope ± interval, 72-h growth against the
    72-h bound, judged or why not (plain text, escaped by ``_figure``)."""
    unit = str(fit.get("unit") or "")
    ci = fit.get("ci95_per_h")
    if fit.get("slope_per_h") is None or not isinstance(ci, list) or len(ci) != 2:
        slope = (f"{_g(fit.get('points'))} points over {_g(fit.get('span_h'))} h: "
                 "too few for a slope")
    else:
        slope = (f"slope {_g(fit['slope_per_h'], True)} {unit}/h (95% interval {_g(ci[0], True)}"
                 f" .. {_g(ci[1], True)}); over 72 h {_g(fit.get('growth_72h'), True)} {unit} "
                 f"vs bound {_g(fit.get('bound_72h'))} {unit}")
    return (f"{slope} · last {_g(fit.get('last'))} {unit} · {_g(fit.get('segments'))} segment(s)"
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
              if isinstance(p, list) and len(p) == 2 and _num(p[0]) and _num(p[1])]
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
        out.append(f"<p>drift invariant valid: <b>{_e(drift.get('valid'))}</b> · "
                   f"{_e(details.get('series_judged'))} series judged · settle "
                   f"{_e(details.get('settle_s'))} s · min span {_e(details.get('min_span_h'))} h"
                   f" · bounds per hour {_e(details.get('bounds_per_h'))}"
                   + (f" · {_e(details['why'])}" if details.get("why") else "") + "</p>")
    if endurance.get("drift"):
        out.append(f"<p>endurance: {_e(endurance['drift'])}</p>")
    rows: list[str] = []
    charts: list[str] = []
    for t0_wall, series in groups:
        t0 = parse_iso(t0_wall) if t0_wall else None
        hours = [p[0] for _, _, fit in series for p in fit.get("chart") or []
                 if isinstance(p, list) and p and _num(p[0])]
        x_max = max(hours, default=0.0) * 3600 or 1.0
        shades = _drift_shades(faults, t0, x_max)
        for node, what, fit in series:
            i = len(rows)
            if i >= MAX_DRIFT_SERIES:
                break
            finding = _drift_finding(fit)
            ci = fit.get("ci95_per_h") if isinstance(fit.get("ci95_per_h"), list) else []
            unit = _e(fit.get("unit") or "")
            rows.append(
                f'<tr><td><a href="#drift-{i}">{_e(node)}</a></td><td>{_e(what)}</td>'
                f"<td>{_e(_g(fit.get('slope_per_h'), True))} {unit}</td>"
                f"<td>{' .. '.join(_e(_g(v, True)) for v in ci)}</td>"
                f"<td>{_e(_g(fit.get('growth_72h'), True))} {unit}</td>"
                + (f"<td>{_e(_g(fit['bound_per_h']))} {unit}/h (72 h: "
                   f"{_e(_g(fit.get('bound_72h')))} {unit})</td>"
                   if fit.get("bound_per_h") is not None else "<td>none</td>")
                + f"<td>{_e(_drift_judged(node, fit))}</td>"
                + (f'<td class="valid-false">{_e(finding)}</td></tr>' if finding == "yes"
                   else f"<td>{_e(finding)}</td></tr>"))
            charts.append(f'<div id="drift-{i}">'
                          + _figure(_drift_chart(node, what, fit, x_max, shades),
                                    _drift_figures(node, fit)) + "</div>")
    total = sum(len(series) for _, series in groups)
    more = (f'<p class="small">… {total - len(rows)} more series in summary.json.</p>'
            if total > len(rows) else "")
    out.append('<table id="drift-table"><tr><th>node</th><th>series</th><th>slope per h</th>'
               "<th>95% interval</th><th>growth over 72 h</th><th>bound</th><th>judged</th>"
               f"<th>finding</th></tr>{''.join(rows)}</table>{more}")
    return "".join(out + charts)


def section_gpu(summary: dict[str, Any]) -> str:
    """The GPU by phase (summary "gpu", reports.gpu.gpu_phases): NVML's SM
    clock and throttle reasons next to the latency the requests saw."""
    gpu = summary.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("phases"), list):
        return ""
    warm = (f"; warmup is the load's first {_e(gpu['warmup_s'])} s, not steady state"
            if gpu.get("warmup_s") else "")
    out = ["<h2>GPU by phase</h2>",
           f'<p class="small">NVML readings and requests per phase; "after X" is the '
           f"{_e(gpu.get('after_heal_s'))} s after X healed{warm}. Devices: "
           f"{_e(gpu.get('devices'))}.</p>",
           "<table><tr><th>phase</th><th>from-to (s)</th><th>ok/fail/info</th>"
           "<th>TTFT p50/p90 ms</th><th>TPOT p50/p90 ms</th><th>SM clock med/min MHz</th>"
           "<th>reason bits</th><th>util %</th><th>mem used min-max MiB</th>"
           "<th>power W</th><th>engine</th></tr>"]
    for p in gpu["phases"][:200]:
        if not isinstance(p, dict):
            continue
        g = p.get("gpu") or {}
        eng = "; ".join(f"{k}: {v.get('min'):.0f}-{v.get('max'):.0f}"
                        for k, v in (p.get("engine") or {}).items() if isinstance(v, dict))
        out.append(
            f"<tr><td>{_e(p.get('phase'))}</td><td>{_e(p.get('from_s'))}-{_e(p.get('to_s'))}</td>"
            f"<td>{_e(p.get('requests_ok'))}/{_e(p.get('requests_fail'))}/"
            f"{_e(p.get('requests_info'))}</td>"
            f"<td>{_e(p.get('ttft_ms_p50'))} / {_e(p.get('ttft_ms_p90'))}</td>"
            f"<td>{_e(p.get('tpot_ms_p50'))} / {_e(p.get('tpot_ms_p90'))}</td>"
            f"<td>{_e(g.get('sm_clock_mhz_median'))} / {_e(g.get('sm_clock_mhz_min'))}</td>"
            f'<td class="mono">{_e(g.get("reason_bits_seen"))} {_e(g.get("reasons_seen"))}</td>'
            f"<td>{_e(g.get('util_gpu_pct_median'))}</td>"
            f"<td>{_e(g.get('mem_used_mb_min'))}-{_e(g.get('mem_used_mb_max'))}</td>"
            f"<td>{_e(g.get('power_w_median'))}</td><td class=\"mono\">{_e(eng, 300)}</td></tr>")
    out.append("</table>")
    return "".join(out)


MINIMAL_SCHEDULE = "minimal-schedule.json"  # written by an exploration (issue 12)


def section_minimal_schedule(run_dir: Path) -> str:
    """An exploration's finding: the shrunk schedule and how to replay it.
    Empty when the run did not explore or found nothing."""
    path = run_dir / MINIMAL_SCHEDULE
    if not path.exists():
        return ""
    doc = json.loads(path.read_text(encoding="utf-8"))
    steps = [s for s in doc.get("steps") or [] if isinstance(s, dict)]
    rows = "".join(f"<tr><td>{_e(s.get('at_s'))}</td><td>{_e(s.get('action'))}</td>"
                   f"<td>{_e(s.get('kind'))}</td><td>{_e(s.get('target'))}</td>"
                   f'<td class="mono">{_e(s.get("params"))}</td></tr>' for s in steps[:100])
    return (f'<h2 id="minimal-schedule">Minimal failing schedule</h2><p>The exploration broke '
            f"{_e(', '.join(map(str, doc.get('broke') or [])))}; Hypothesis shrank the failing "
            f"examples to these {len(steps)} step(s) (seconds from the start of the load). "
            f'Replay: <span class="mono">pytest suites/test_explore.py -m explore --replay '
            f"{_e(str(path))}</span></p><table><tr><th>at (s)</th><th>action</th><th>kind</th>"
            f"<th>target</th><th>params</th></tr>{rows}</table>")


def _op_row(op: dict[str, Any]) -> str:
    cls = ' class="focus"' if op.get("focus") else ""
    rest = {k: v for k, v in op.items()
            if k not in ("index", "wall", "type", "process", "f", "output", "prompt", "error",
                         "focus")}
    text = "".join(f"<div>{k}: <span class=\"mono\">{_e(op[k], 300)}</span></div>"
                   for k in ("error", "prompt", "output") if op.get(k))
    return (f"<tr{cls}><td>{_e(op.get('index'))}</td><td>{_e(op.get('wall'))}</td>"
            f"<td>{_e(op.get('type'))}</td><td>{_e(op.get('process'))}</td><td>{_e(op.get('f'))}"
            f'</td><td><span class="mono">{_e(rest, 300)}</span>{text}</td></tr>')


def section_contexts(data: ReportData | None) -> str:
    out = ["<h2>Ops around failures and counterexamples</h2>"]
    if data is None or not data.contexts:
        out.append("<p>No failed or unknown requests, and no counterexamples with an op index.</p>")
        return "".join(out)
    for ctx in data.contexts:
        out.append(f'<h3 id="op-{ctx.index}">op {ctx.index}: {_e(ctx.why, 300)}</h3>'
                   "<table><tr><th>index</th><th>wall</th><th>type</th><th>process</th><th>f</th>"
                   "<th>value (selected fields)</th></tr>"
                   + "".join(_op_row(op) for op in ctx.ops) + "</table>")
    return "".join(out)


def build_page(run_dir: Path) -> str:
    """The whole page as a string; each section is guarded so one broken
    part leaves the others."""
    problems: list[str] = []
    summary, why = load_summary(run_dir)
    if why:
        problems.append(why)
    data: ReportData | None = None
    history = run_dir / "history.jsonl"
    if history.exists():
        data = collect(history, summary)
        problems.extend(data.problems)
    else:
        problems.append(f"{history} is missing")
    parts = []
    for make in (lambda: section_findings(summary), lambda: section_minimal_schedule(run_dir),
                 lambda: section_invariants(summary, data), lambda: section_plots(data),
                 lambda: section_faults(summary, data), lambda: section_drift(summary),
                 lambda: section_gpu(summary),
                 lambda: section_contexts(data)):
        try:
            parts.append(make())
        except Exception as e:  # noqa: BLE001 - keep the rest of the page
            problems.append(f"a section could not be drawn: {type(e).__name__}: {e} "
                            f"({traceback.format_exc(limit=-1).strip().splitlines()[-2].strip()})")
    head = section_head(summary, data, problems)
    title = escape(f"Ordeal {summary.get('verdict', 'unknown')}: "
                   f"{summary.get('run_id', run_dir.name)}")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'style-src \'unsafe-inline\'; img-src data:">'
            f"<title>{title}</title><style>{CSS}</style></head><body>"
            f"{head}{''.join(parts)}</body></html>\n")


#: Fault windows an interim page shows (the latest; summary.json has all).
MAX_INTERIM_FAULTS = 300


def build_interim_page(interim: dict[str, Any], faults: list[dict[str, Any]],
                       run_name: str) -> str:
    """An endurance run's page while it goes (issue 44), from what the
    judge holds (its interim.json and the latest fault windows), never from
    the history: re-reading a 72-hour history every few minutes would cost
    what judging it once does. Marked interim at the top; the final report
    replaces it at the end of the run, with the plots and the ops around
    each failure."""
    invs = [i for i in interim.get("invariants") or [] if isinstance(i, dict)]
    false = [str(i.get("name")) for i in invs if i.get("valid") is False]
    so_far = (f"FALSE so far: {', '.join(false)}" if false else
              "RUNNING: none false so far")
    css = "fail" if false else "unknown"
    active = [f"{k} on {t}" for k, t in interim.get("active_faults") or []]
    rss = interim.get("harness_rss_mb") or []
    facts = [f"written {_e(interim.get('written', '?'))}",
             f"{_hms(interim.get('elapsed_s'))} of {_hms(interim.get('run_s'))}",
             "ops: " + " · ".join(f"{_e(k)} {_e(v)}" for k, v in
                                  (interim.get("ops") or {}).items()),
             f"active faults: {_e(', '.join(active) or 'none')}",
             "kinds exercised: " + (" · ".join(f"{_e(k)} {_e(v)}" for k, v in
                                               (interim.get("kinds_exercised") or {}).items())
                                    or "none yet")]
    if rss and isinstance(rss[-1], (list, tuple)) and len(rss[-1]) == 2:
        facts.append(f"harness RSS {_e(rss[-1][1])} MB")
    if interim.get("stop_reason"):
        facts.append(f"stopping: {_e(interim['stop_reason'], 400)}")
    if interim.get("history_damage"):
        facts.append(f"history damage: {_e(interim['history_damage'])} line(s) or chunk(s)")
    shown = faults[-MAX_INTERIM_FAULTS:]
    more = (f'<p class="small">the latest {len(shown)} of {len(faults)} fault windows</p>'
            if len(faults) > len(shown) else "")
    summary = {"invariants": invs, "faults": shown}
    body = (f"<h1>Ordeal run {_e(run_name)} (interim)</h1>"
            f'<div class="verdict v-{css}" id="verdict">{escape(so_far)}</div>'
            '<div class="scope" id="interim"><p><b>Interim page</b>: the invariants as '
            'judged so far, rewritten every <span class="mono">--interim-every</span>. No '
            "verdict yet: the run decides it at its end, when the final report replaces this "
            "page (with the plots and the ops around each failure, which read the whole "
            "history).</p></div>"
            f'<p>{" · ".join(facts)}</p>'
            + section_invariants(summary, None) + section_faults(summary, None) + more)
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'style-src \'unsafe-inline\'; img-src data:">'
            f"<title>Ordeal interim: {escape(run_name)}</title><style>{CSS}</style></head>"
            f"<body>{body}</body></html>\n")


def render_interim(run_dir: Path, interim: dict[str, Any],
                   faults: list[dict[str, Any]]) -> Path:
    """Write the interim ``report.html`` (``build_interim_page``); never
    raises, like ``render_report``: the run goes on whatever the page."""
    return _render(Path(run_dir), lambda: build_interim_page(interim, faults, Path(run_dir).name),
                   "Interim page", "interim.json")


def render_report(run_dir: Path) -> Path:
    """Write ``report.html`` in ``run_dir`` and return its path. Never
    raises: the harness calls it last, and a broken report must not hide the
    run's result. If the page cannot be built, a short page says why; if it
    cannot be written, the reason goes to stderr."""
    return _render(Path(run_dir), lambda: build_page(Path(run_dir)), "Report",
                   "summary.json and history.jsonl")


def _render(run_dir: Path, build: Callable[[], str], what: str, see: str) -> Path:
    """``build()``'s page as report.html; if it raises, a short page that
    says why and where the run's data is (``see``)."""
    out = run_dir / REPORT_NAME
    try:
        page = build()
    except Exception as e:  # noqa: BLE001
        page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Ordeal {what}"
                f"</title></head><body><h1>{what} could not be drawn</h1><pre>"
                f"{escape(f'{type(e).__name__}: {e}')}</pre><p>See {see} in "
                f"{escape(str(run_dir))}.</p></body></html>\n")
    _write_page(out, page)
    return out


def _write_page(out: Path, page: str) -> None:
    """Replace ``out`` whole (a reader never sees half a page); a failure
    goes to stderr, never up."""
    try:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        print(f"ordeal: could not write {out}: {e}", file=sys.stderr)
