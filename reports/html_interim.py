"""The interim report.html of an endurance run (issue 44): rewritten with
every interim.json, marked interim, drawn from the judge's own figures
(re-reading a 72-hour history every few minutes would cost what judging
it does). The run's end writes the final report over it."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from .html import section_faults, section_invariants
from .html_common import CSS, esc, hms, render_page

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
    facts = [f"written {esc(interim.get('written', '?'))}",
             f"{hms(interim.get('elapsed_s'))} of {hms(interim.get('run_s'))}",
             "ops: " + " · ".join(f"{esc(k)} {esc(v)}" for k, v in
                                  (interim.get("ops") or {}).items()),
             f"active faults: {esc(', '.join(active) or 'none')}",
             "kinds exercised: " + (" · ".join(f"{esc(k)} {esc(v)}" for k, v in
                                               (interim.get("kinds_exercised") or {}).items())
                                    or "none yet")]
    if rss and isinstance(rss[-1], (list, tuple)) and len(rss[-1]) == 2:
        facts.append(f"harness RSS {esc(rss[-1][1])} MB")
    if interim.get("stop_reason"):
        facts.append(f"stopping: {esc(interim['stop_reason'], 400)}")
    if interim.get("history_damage"):
        facts.append(f"history damage: {esc(interim['history_damage'])} line(s) or chunk(s)")
    shown = faults[-MAX_INTERIM_FAULTS:]
    more = (f'<p class="small">the latest {len(shown)} of {len(faults)} fault windows</p>'
            if len(faults) > len(shown) else "")
    summary = {"invariants": invs, "faults": shown}
    body = (f"<h1>Ordeal run {esc(run_name)} (interim)</h1>"
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
    name = Path(run_dir).name
    return render_page(Path(run_dir), lambda: build_interim_page(interim, faults, name),
                   "Interim page", "interim.json")
