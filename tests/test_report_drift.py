"""report.html's "Drift over the run" (issue 27): each drift series drawn
with the fault windows shaded, the table of slopes and findings, the
harness's own series shown but not judged, untrusted node names escaped.

The drift figures come from the real producers (``invariants.drift.Drift``
fed monitor samples, ``runs.endurance.harness_drift``), so a change in
their shape shows here rather than as a blank section."""

from __future__ import annotations

import json
import random
import re

from invariants import RunContext
from invariants.drift import Drift
from invariants.settings import CheckerSettings
from ordeal.history.ops import MONITOR, Op, parse_iso, utc_iso
from reports.html import build_page, render_report
from reports.plots import LEFT, RIGHT, WIDTH
from reports.run_dir import RunDir
from reports.summary import build_summary
from runs.endurance import harness_drift

SCRIPT = "<script>alert(1)</script>"
HOSTILE = f"router{SCRIPT}"
T0 = parse_iso("2026-12-02T00:00:00.000Z")
HOURS = 3.0


def _samples() -> list[Op]:
    """Three hours of monitor samples a minute apart: replica-0 leaks 30 MB
    an hour (the bound is 10), the hostile-named router stays flat."""
    rng = random.Random(27)
    ops: list[Op] = []
    t = 0.0
    while t <= HOURS * 3600:
        for node, rss in (("replica-0", 500 + 30 * t / 3600), (HOSTILE, 200.0)):
            value = {"node": node, "pid": 1, "health": 200,
                     "rss_bytes": int((rss + rng.gauss(0, 2)) * 2**20), "fds": 40,
                     "threads": 12, "metrics": {}}
            ops.append(Op(len(ops), int(t * 1e9), utc_iso(T0 + t), "info", MONITOR, "sample",
                          value))
        t += 60.0
    return ops


def _faults() -> list[dict]:
    """One window healed (0.5 h to 0.6 h) and one never healed (from 2.5 h)."""
    return [{"kind": "process_kill", "target": "replica-0", "injected": utc_iso(T0 + 1800),
             "healed": utc_iso(T0 + 2160)},
            {"kind": "network_partition", "target": "router", "injected": utc_iso(T0 + 9000),
             "healed": None}]


def _summary(run_id: str, invariants: list[dict], faults: list[dict],
             endurance: dict | None = None) -> dict:
    summary = build_summary(
        run_id=run_id, suite="test_drift_report", started=utc_iso(T0),
        ended=utc_iso(T0 + HOURS * 3600), cluster={"backend": "local", "engine": "vllm",
                                                   "nodes": []},
        counts={}, nemesis_counts={}, faults=faults, invariants=invariants,
        workload={"rate": 1.0})
    if endurance is not None:
        summary["endurance"] = endurance
    return summary


def drift_run(root) -> RunDir:
    rd = RunDir.create(root, "drift")
    drift = Drift().check(_samples(), RunContext(settings=CheckerSettings())).to_dict()
    harness = harness_drift([(T0 + t, 80.0 + t / 3600, 9, 4) for t in range(0, 7200, 30)],
                            CheckerSettings())
    rd.write_summary(_summary(rd.run_id, [drift], _faults(), {
        "harness_drift": harness, "drift": "judged: the drift invariant"}))
    return rd


def _section(page: str) -> str:
    start = page.index('<h2 id="drift">')
    end = page.find("<h2", start + 1)
    return page[start:end if end >= 0 else len(page)]


def test_drift_section_has_a_table_row_and_a_chart_per_series(tmp_path):
    page = render_report(drift_run(tmp_path).path).read_text()
    section = _section(page)
    assert "Drift over the run" in section
    assert "endurance: judged: the drift invariant" in section
    table = section[section.index('<table id="drift-table">'):section.index("</table>")]
    rows = re.findall(r"<tr><td>.*?</tr>", table)
    # two nodes and the harness, three series each (no KV or request metrics sampled)
    assert len(rows) == 9
    assert len(re.findall(r"<svg ", section)) == 9
    leak = next(r for r in rows if ">replica-0<" in r and "<td>rss_mb</td>" in r)
    assert "<td>yes</td>" in leak and '<td class="valid-false">yes</td>' in leak
    assert "10 MB/h (72 h: 720 MB)" in leak
    flat = next(r for r in rows if "router&lt;script&gt;" in r and "<td>rss_mb</td>" in r)
    assert flat.endswith("<td>no</td></tr>")
    harness = [r for r in rows if ">harness<" in r]
    assert len(harness) == 3
    assert all("harness (shown, not judged)" in r for r in harness)
    # the line under a chart: slope with its interval, 72-h growth against the bound
    assert re.search(r"slope \+[23]\d(\.\d+)? MB/h \(95% interval \+\d.* \.\. \+\d.*\); over 72 h "
                     r"\+\d+ MB vs bound 720 MB .* judged: yes · finding: yes", section)


def test_fault_windows_are_shaded_on_each_chart_at_their_hours(tmp_path):
    rd = drift_run(tmp_path)
    section = _section(build_page(rd.path))
    first = section[section.index('<div id="drift-0">'):section.index('<div id="drift-1">')]
    shades = re.findall(r'<rect class="fault" x="([\d.]+)" y="\d+" width="([\d.]+)"', first)
    assert len(shades) == 2
    assert "<title>process_kill@replica-0</title>" in first
    assert "<title>network_partition@router</title>" in first
    nodes = json.loads(rd.summary_path.read_text())["invariants"][0]["details"]["nodes"]
    x_max = max(t for figs in nodes.values() for fit in figs.values() for t, _ in fit["chart"])
    x_max *= 3600  # the charts' axis: seconds since the drift invariant's t0
    plot_w = WIDTH - LEFT - RIGHT
    (x0, w0), (x1, w1) = sorted((float(x), float(w)) for x, w in shades)
    assert abs(x0 - (LEFT + plot_w * 1800 / x_max)) < 0.2
    assert abs(w0 - plot_w * 360 / x_max) < 0.2
    # never healed: shaded to the chart's end
    assert abs(x1 + w1 - (LEFT + plot_w)) < 0.2
    # six node charts show both windows; the harness's two hours end before the second
    assert section.count('<rect class="fault"') == 2 * 6 + 3


def test_untrusted_node_names_are_escaped(tmp_path):
    page = render_report(drift_run(tmp_path).path).read_text()
    assert SCRIPT not in page
    assert "router&lt;script&gt;alert(1)&lt;/script&gt;" in _section(page)


def test_hundreds_of_fault_windows_draw_a_bounded_number_of_shades(tmp_path):
    rd = RunDir.create(tmp_path, "drift")
    drift = Drift().check(_samples(), RunContext(settings=CheckerSettings())).to_dict()
    faults = [{"kind": "http_fault", "target": "replica-0", "injected": utc_iso(T0 + t),
               "healed": utc_iso(T0 + t + 5)} for t in range(0, int(HOURS * 3600), 10)]
    rd.write_summary(_summary(rd.run_id, [drift], faults))
    section = _section(build_page(rd.path))
    per_chart = section.count('<rect class="fault"') / section.count("<svg ")
    assert per_chart <= 5  # 1080 windows 10 s apart merge at two pixels per shade
    assert "+1079 more" in section


def test_a_run_without_drift_has_no_drift_section(tmp_path):
    rd = RunDir.create(tmp_path, "plain")
    rd.write_summary(_summary(rd.run_id, [{"name": "no_silent_loss", "valid": True,
                                           "details": {}, "counterexamples": []}], _faults()))
    page = build_page(rd.path)
    assert 'id="drift"' not in page and "Drift over the run" not in page
    # an endurance run whose harness took no samples: still nothing to draw
    rd.write_summary(_summary(rd.run_id, [], [], {"harness_drift": {}, "drift": "not judged"}))
    assert "Drift over the run" not in build_page(rd.path)
