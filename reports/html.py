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
import traceback
from html import escape
from pathlib import Path
from typing import Any

from .collect import NODE_METRICS, ReportData, collect
from .findings import bounds_text
from .html_common import CSS, esc, figure, hms, render_page, valid_cell
from .html_drift import section_drift
from .plots import Chart, Series, Shade, render_strips

MAX_FIGURES = 8  # key figures shown per invariant


MAX_CX = 5  # counterexamples shown per invariant


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


def _figures(details: Any) -> str:
    """Scalar top-level details, the figures a person reads first."""
    if not isinstance(details, dict):
        return esc(details)
    items = [(k, v) for k, v in details.items()
             if isinstance(v, (str, int, float, bool)) or v is None][:MAX_FIGURES]
    lists = [(k, v) for k, v in details.items() if isinstance(v, list) and v][:2]
    parts = [f"{esc(k)}={esc(v, 120)}" for k, v in items + lists]
    return "<br>".join(parts) or '<span class="small">(see summary.json)</span>'


def _counterexamples(cxs: Any, linked: set[int]) -> str:
    if not isinstance(cxs, list) or not cxs:
        return ""
    rows = []
    for cx in cxs[:MAX_CX]:
        if not isinstance(cx, dict):
            rows.append(esc(cx, 200))
            continue
        idx = cx.get("index")
        label = f"op {idx}" if isinstance(idx, int) else "op ?"
        ref = (f'<a href="#op-{idx}">{escape(label)}</a>' if isinstance(idx, int) and idx in linked
               else escape(label))
        rest = {k: v for k, v in cx.items() if k not in ("index", "problem")}
        rows.append(f'{ref}: {esc(cx.get("problem", ""), 200)} '
                    f'<span class="mono">{esc(rest, 300)}</span>')
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
        f"<li><b>{esc(name)}</b>{' (required by --require-judged)' if v.get('required') else ''}"
        f": {esc(v.get('why', ''), 300)}</li>"
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
    out = [f"<h1>Ordeal run {esc(summary.get('run_id', '(unknown run)'))}</h1>",
           f'<div class="verdict v-{css}" id="verdict">Verdict: {escape(verdict.upper())}</div>',
           _scope(summary),
           (f'<p>suite <b>{esc(summary.get("suite", "?"))}</b> · started '
            f'{esc(summary.get("started", "?"))} · ended {esc(summary.get("ended", "?"))} · '
            f'backend '
            f'{esc(cluster.get("backend", "?"))} · engine {esc(cluster.get("engine", "?"))}</p>'),
           _timing(summary),
           "<p>ops: " + " · ".join(f"{esc(k)} {esc(v)}" for k, v in ops.items()) + "</p>"]
    if wl:
        keys = ("mode", "rate", "duration_s", "concurrency", "stream_share", "seed")
        out.append('<p class="small">workload: ' + " · ".join(
            f"{k} {esc(wl[k])}" for k in keys if k in wl) + "</p>")
    nodes = [n for n in cluster.get("nodes") or [] if isinstance(n, dict)]
    if nodes:  # no URLs: they may carry credentials on a real cluster
        out.append("<table><tr><th>node</th><th>role</th><th>fingerprint</th></tr>" + "".join(
            f"<tr><td>{esc(n.get('name'))}</td><td>{esc(n.get('role'))}</td>"
            f"<td>{esc(n.get('fingerprint'))}</td></tr>" for n in nodes) + "</table>")
    out.append(_stack(cluster, nodes))
    errs = [str(e) for e in summary.get("errors") or []]
    if errs or problems:
        out.append('<div class="problems" id="problems"><b>Problems</b><ul>' + "".join(
            f"<li>run error: {esc(e, 1000)}</li>" for e in errs[:30]) + "".join(
            f"<li>report: {esc(p, 1000)}</li>" for p in problems[:60]) + "</ul></div>")
    return "".join(out)


def _timing(summary: dict[str, Any]) -> str:
    """How long the whole run ran (summary ``duration_s``) and, for a
    resumed run, each segment and the gaps between them (``segments``)."""
    segs = [s for s in summary.get("segments") or [] if isinstance(s, dict)]
    if summary.get("duration_s") is None and len(segs) < 2:
        return ""
    out = f'<p class="small" id="timing">ran {hms(summary.get("duration_s"))} (monotonic clock)'
    if len(segs) < 2:
        return out + "</p>"
    out += (f" over {len(segs)} segments: resumed {len(segs) - 1} time(s), down "
            f"{hms(summary.get('down_s'))} between them (not counted)</p>"
            "<table><tr><th>segment</th><th>started</th><th>ended</th><th>ran</th>"
            "<th>resumed after a gap</th></tr>")
    for i, seg in enumerate(segs):
        gap = seg.get("resumed_from_gap") if isinstance(seg.get("resumed_from_gap"), dict) else {}
        out += (f"<tr><td>{i + 1}</td><td>{esc(seg.get('started'))}</td>"
                f"<td>{esc(seg.get('ended'))}</td><td>{hms(seg.get('duration_s'))}</td><td>"
                + (f"down {hms(gap.get('down_s'))} (last op {esc(gap.get('from'))})" if gap
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
        parts.append(f"model <b>{esc(model.get('name'))}</b> ({esc(model.get('source', '?'))}, "
                     f"{esc(', '.join(model.get('architectures') or []) or '?')}"
                     + (f", {size / 1e6:.1f} MB" if isinstance(size, (int, float)) else "")
                     + f", config {esc(str(model.get('config_sha256') or '?')[:12])})")
    for key in ("served_model_name", "router_profile", "engine_args", "engine_env",
                "router_args", "ordeal_engine_flags", "router_profile_flags"):
        if key in stack:
            parts.append(f"{esc(key)} <span class=\"mono\">{esc(stack[key], 400)}</span>")
    commands = "".join(f"<li><b>{esc(n.get('name'))}</b> <span class=\"mono\">"
                       f"{esc(' '.join(n.get('command') or []), 2000)}</span></li>"
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
        named = esc("; ".join(map(str, known)), 300) if known else ""
        tag = (f'<span class="valid-unknown">known</span> ({named}): '
               if known else '<span class="valid-false">new</span>: ')
        examples = ", ".join(
            (f'<a href="#op-{e["index"]}">op {e["index"]}</a>' if isinstance(e.get("index"), int)
             else esc(e.get("window"))) for e in f.get("examples") or [] if isinstance(e, dict))
        figures = " · ".join(f"{esc(k)}={esc(v, 80)}" for k, v in (f.get("figures") or {}).items())
        # A known finding's bounds beside the worst figure it covered, or the
        # figure beyond a known finding's bound that made it new.
        sizes = [*(f"within its bounds: {b}" for b in f.get("known_bounds") or [] if known),
                 *(f"beyond a known finding: {b}" for b in f.get("beyond_known") or [])]
        items.append(f"<li>{tag}<b>{esc(f.get('invariant'))}</b>: {esc(f.get('what'), 400)}"
                     + "".join(f'<br><span class="small bounds">{esc(b, 400)}</span>'
                               for b in sizes[:4])
                     + f'<br><span class="small">{figures}</span>'
                     + (f'<br><span class="small">examples: {examples}</span>' if examples else "")
                     + (f'<br><span class="mono">replay: {esc(f.get("replay"), 400)}</span>'
                        if f.get("replay") else "") + "</li>")
    return f'<h2 id="findings">Findings</h2><ul>{"".join(items)}</ul>'


def section_invariants(summary: dict[str, Any], data: ReportData | None) -> str:
    invs = [i for i in summary.get("invariants") or [] if isinstance(i, dict)]
    if not invs:
        return "<h2>Invariants</h2><p>No invariant results in summary.json.</p>"
    linked = {c.index for c in data.contexts} if data else set()
    rows = "".join(
        f"<tr><td>{esc(i.get('name'))}</td>{valid_cell(i.get('valid'))}"
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
                  f"{esc(f.get('reason'))}; tracked: {esc(f.get('tracked'))}; "
                  f"within its bounds: {esc(bounds_text(f), 300)}</p>"
                  for f in findings if isinstance(f, dict)) if isinstance(findings, list) else ""
    return out + "".join(f'<p class="known"><b>beyond a known finding</b> (in the verdict): '
                         f"{esc(b.get('window'))}: {esc(bounds_text(b), 300)}; the finding: "
                         f"{esc(b.get('reason'))}</p>"
                         for b in (beyond if isinstance(beyond, list) else [])
                         if isinstance(b, dict))


def _known_findings(known: Any) -> str:
    if not isinstance(known, dict):
        return ""
    not_seen = "".join(f"<li>{esc(f.get('invariant'))} under {esc(f.get('fault'))}@"
                       f"{esc(f.get('target'))}: {esc(f.get('reason'))}</li>"
                       for f in known.get("not_seen") or [] if isinstance(f, dict))
    matched = "".join(f"<li>{esc(f.get('invariant'))} under {esc(f.get('fault'))}@"
                      f"{esc(f.get('target'))}: {esc(f.get('violations'))} violation(s), "
                      f"{esc(bounds_text(f), 300)}</li>"
                      for f in known.get("matched") or [] if isinstance(f, dict))
    beyond = [b for b in known.get("beyond") or [] if isinstance(b, dict)]
    return (f'<p class="small" id="known-findings">known findings: {esc(known.get("file"))} '
            f"({esc(known.get('chosen_by'))}), {len(known.get('matched') or [])} matched"
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
    out.append(figure(lat, f"per {w:g} s bucket by invoke time; dots: a sample of "
                            f"{len(data.cloud)} of {data.seen_requests} requests (blue E2E, "
                            "orange TTFT)"))
    itl = Chart("Inter-token latency (ms)", "ITL, ms (log)", x_max, shades=shades, log_y=True)
    itl.series = [Series("ITL p50", per_bucket(q("itl", 0.5)), "#6a3d9a"),
                  Series("ITL p99", per_bucket(q("itl", 0.99)), "#6a3d9a", True)]
    out.append(figure(itl, "between streamed chunks, as vllm bench serve defines ITL"))
    rate = Chart("Throughput and goodput", "requests/s", x_max, shades=shades)
    rate.series = [Series("ok/s", counts(lambda b: b.ok / w), "#1f77b4", True),
                   Series("goodput/s (within SLO)", counts(lambda b: b.good / w), "#2ca02c"),
                   Series("fail/s", counts(lambda b: b.fail / w), "#d62728"),
                   Series("info/s (unknown)", counts(lambda b: b.info / w), "#e69500")]
    out.append(figure(rate, "by completion time"))
    kinds = sorted({k for b in bs if b for k in b.errors})
    errs = Chart("Errors and unknown outcomes by kind", "requests/s", x_max, shades=shades)
    errs.series = [Series(f"{t}: {k}", counts(lambda b, key=(t, k): b.errors.get(key, 0) / w))
                   for t, k in kinds]
    out.append(figure(errs, "fail = certainly did not run; info = outcome unknown"
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
            out.append(figure(Chart(label, label, x_max, series, shades=shades), note))
    if not data.gpu_keys:
        why = getattr(data, "gpu_note", None) or "no GPU on this cluster"
        out.append(f'<p class="small">GPU telemetry: none ({escape(why)}).</p>')
    return out


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
            out.append(f"<tr><td>{esc(f.get('kind'))}</td><td>{esc(f.get('target'))}</td>"
                       f"<td>{esc(f.get('injected'))}</td><td>{esc(f.get('healed'))}</td>"
                       f'<td class="mono">{esc(f.get("inject_result"), 300)}</td>'
                       f'<td class="mono">{esc(f.get("heal_result"), 300)}</td>'
                       f"<td>{esc(f.get('error') or '')}</td></tr>")
        out.append("</table>")
    elif data and data.windows:
        out.append("<table><tr><th>window</th><th>from (s)</th><th>to (s)</th></tr>" + "".join(
            f"<tr><td>{esc(lbl)}</td><td>{s:.1f}</td>"
            f"<td>{'' if e is None else f'{e:.1f}'}</td></tr>"
            for s, e, lbl in data.windows) + "</table>")
    else:
        out.append("<p>No faults were injected in this run.</p>")
    return "".join(out)


def section_gpu(summary: dict[str, Any]) -> str:
    """The GPU by phase (summary "gpu", reports.gpu.gpu_phases): NVML's SM
    clock and throttle reasons next to the latency the requests saw."""
    gpu = summary.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("phases"), list):
        return ""
    warm = (f"; warmup is the load's first {esc(gpu['warmup_s'])} s, not steady state"
            if gpu.get("warmup_s") else "")
    out = ["<h2>GPU by phase</h2>",
           f'<p class="small">NVML readings and requests per phase; "after X" is the '
           f"{esc(gpu.get('after_heal_s'))} s after X healed{warm}. Devices: "
           f"{esc(gpu.get('devices'))}.</p>",
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
            f"<tr><td>{esc(p.get('phase'))}</td><td>{esc(p.get('from_s'))}-{esc(p.get('to_s'))}</td>"
            f"<td>{esc(p.get('requests_ok'))}/{esc(p.get('requests_fail'))}/"
            f"{esc(p.get('requests_info'))}</td>"
            f"<td>{esc(p.get('ttft_ms_p50'))} / {esc(p.get('ttft_ms_p90'))}</td>"
            f"<td>{esc(p.get('tpot_ms_p50'))} / {esc(p.get('tpot_ms_p90'))}</td>"
            f"<td>{esc(g.get('sm_clock_mhz_median'))} / {esc(g.get('sm_clock_mhz_min'))}</td>"
            f'<td class="mono">{esc(g.get("reason_bits_seen"))} {esc(g.get("reasons_seen"))}</td>'
            f"<td>{esc(g.get('util_gpu_pct_median'))}</td>"
            f"<td>{esc(g.get('mem_used_mb_min'))}-{esc(g.get('mem_used_mb_max'))}</td>"
            f"<td>{esc(g.get('power_w_median'))}</td><td class=\"mono\">{esc(eng, 300)}</td></tr>")
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
    rows = "".join(f"<tr><td>{esc(s.get('at_s'))}</td><td>{esc(s.get('action'))}</td>"
                   f"<td>{esc(s.get('kind'))}</td><td>{esc(s.get('target'))}</td>"
                   f'<td class="mono">{esc(s.get("params"))}</td></tr>' for s in steps[:100])
    return (f'<h2 id="minimal-schedule">Minimal failing schedule</h2><p>The exploration broke '
            f"{esc(', '.join(map(str, doc.get('broke') or [])))}; Hypothesis shrank the failing "
            f"examples to these {len(steps)} step(s) (seconds from the start of the load). "
            f'Replay: <span class="mono">pytest suites/test_explore.py -m explore --replay '
            f"{esc(str(path))}</span></p><table><tr><th>at (s)</th><th>action</th><th>kind</th>"
            f"<th>target</th><th>params</th></tr>{rows}</table>")


def _op_row(op: dict[str, Any]) -> str:
    cls = ' class="focus"' if op.get("focus") else ""
    rest = {k: v for k, v in op.items()
            if k not in ("index", "wall", "type", "process", "f", "output", "prompt", "error",
                         "focus")}
    text = "".join(f"<div>{k}: <span class=\"mono\">{esc(op[k], 300)}</span></div>"
                   for k in ("error", "prompt", "output") if op.get(k))
    return (f"<tr{cls}><td>{esc(op.get('index'))}</td><td>{esc(op.get('wall'))}</td>"
            f"<td>{esc(op.get('type'))}</td><td>{esc(op.get('process'))}</td><td>{esc(op.get('f'))}"
            f'</td><td><span class="mono">{esc(rest, 300)}</span>{text}</td></tr>')


def section_contexts(data: ReportData | None) -> str:
    out = ["<h2>Ops around failures and counterexamples</h2>"]
    if data is None or not data.contexts:
        out.append("<p>No failed or unknown requests, and no counterexamples with an op index.</p>")
        return "".join(out)
    for ctx in data.contexts:
        out.append(f'<h3 id="op-{ctx.index}">op {ctx.index}: {esc(ctx.why, 300)}</h3>'
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


def render_report(run_dir: Path) -> Path:
    """Write ``report.html`` in ``run_dir`` and return its path. Never
    raises: the harness calls it last, and a broken report must not hide the
    run's result. If the page cannot be built, a short page says why; if it
    cannot be written, the reason goes to stderr."""
    return render_page(Path(run_dir), lambda: build_page(Path(run_dir)), "Report",
                   "summary.json and history.jsonl")
