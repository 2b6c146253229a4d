"""What the pages of reports/html.py (the report, its drift section, the
interim page) share: the inline CSS, escaping of untrusted text (every
string from the cluster or the history goes through ``esc``), the
cells and numbers, and writing a page that never fails the run."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from .plots import Chart, render_chart

REPORT_NAME = "report.html"

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


def esc(v: Any, cap: int = 400) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return escape(s if len(s) <= cap else s[:cap] + " …")


def valid_cell(v: Any) -> str:
    name = {True: "true", False: "false"}.get(v, "unknown") if isinstance(v, bool) or v is None \
        else ("unknown" if str(v) == "unknown" else esc(v))
    return f'<td class="valid-{name}">{name}</td>'


def hms(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "?"
    t = int(max(0, v))
    return f"{t // 3600}:{t % 3600 // 60:02d}:{t % 60:02d}"


def is_num(v: Any) -> bool:
    """A finite number (not a bool): summary.json may be damaged or hand-edited."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fmt_g(v: Any, sign: bool = False) -> str:
    """A figure as text: numbers short (with a sign for slopes), the rest as written."""
    if is_num(v):
        return f"{v:+.4g}" if sign else f"{v:.4g}"
    return "none" if v is None else str(v)


def render_page(run_dir: Path, build: Callable[[], str], what: str, see: str) -> Path:
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
    write_page(out, page)
    return out


def write_page(out: Path, page: str) -> None:
    """Replace ``out`` whole (a reader never sees half a page); a failure
    goes to stderr, never up."""
    try:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        print(f"ordeal: could not write {out}: {e}", file=sys.stderr)


def figure(chart: Chart, note: str) -> str:
    """A chart with its title and a note under it."""
    return (f"<h3>{escape(chart.title)}</h3>{render_chart(chart)}"
            f'<p class="small">{escape(note)}</p>')
