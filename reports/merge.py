"""One summary for a parallel session: every worker's runs, merged.

Each xdist worker writes its own run directories (its own cluster, its own
history); only the controller merges them, once all have finished. Counts
add up; verdicts combine as a run's invariants do (any fail is a fail, all
pass is a pass, anything else unknown); an invariant is merged by name the
same way, with the runs that judged it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .run_dir import write_json_atomic
from .summary import verdict_of

OPS = ("invoked", "ok", "fail", "info", "nemesis")


def merge_summaries(summaries: list[dict[str, Any]],
                    workers: dict[str, str] | None = None) -> dict[str, Any]:
    """``workers``: run id -> worker id, where known."""
    workers = workers or {}
    ops = {k: sum(int(s.get("ops", {}).get(k, 0)) for s in summaries) for k in OPS}
    invariants: dict[str, dict[str, Any]] = {}
    for s in summaries:
        for inv in s.get("invariants", []):
            merged = invariants.setdefault(inv["name"], {"name": inv["name"], "runs": {}})
            merged["runs"][s["run_id"]] = inv.get("valid")
    for merged in invariants.values():
        merged["valid"] = {"pass": True, "fail": False}.get(
            verdict_of(merged["runs"].values()), "unknown")
    return {
        "schema": 1,
        "kind": "session",
        "runs": [{"run_id": s["run_id"], "suite": s.get("suite"), "worker":
                  workers.get(s["run_id"], s.get("worker")), "verdict": s.get("verdict"),
                  "ops": s.get("ops"), "backend": (s.get("cluster") or {}).get("backend")}
                 for s in summaries],
        "workers": sorted({w for w in (workers.get(s["run_id"], s.get("worker"))
                                       for s in summaries) if w}),
        "ops": ops,
        "invariants": sorted(invariants.values(), key=lambda x: x["name"]),
        "verdict": verdict_of(_as_valid(s.get("verdict")) for s in summaries),
    }


def _as_valid(verdict: Any) -> Any:
    """A run's verdict as an invariant's valid value, for verdict_of."""
    return {"pass": True, "fail": False}.get(verdict, "unknown")


def merged_markdown(merged: dict[str, Any]) -> str:
    lines = [f"# Session: verdict {merged['verdict']}", "",
             f"{len(merged['runs'])} run(s) on worker(s) {', '.join(merged['workers']) or '-'}; "
             f"ops {merged['ops']}", "", "| run | worker | backend | verdict | invoked | ok |",
             "|---|---|---|---|---:|---:|"]
    for r in merged["runs"]:
        ops = r.get("ops") or {}
        lines.append(f"| [{r['run_id']}]({r['run_id']}/report.html) | {r.get('worker') or '-'} "
                     f"| {r.get('backend') or '-'} | {r['verdict']} | {ops.get('invoked', 0)} "
                     f"| {ops.get('ok', 0)} |")
    lines += ["", "| invariant | merged | per run |", "|---|---|---|"]
    for inv in merged["invariants"]:
        per = ", ".join(f"{k[-4:]}={v}" for k, v in inv["runs"].items())
        lines.append(f"| {inv['name']} | {inv['valid']} | {per} |")
    return "\n".join(lines) + "\n"


def write_session(runs_dir: Path, name: str, merged: dict[str, Any]) -> Path:
    """``<runs_dir>/<name>.session.json`` and ``.md`` beside the run dirs
    (whose reports the Markdown links to)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / f"{name}.session.json"
    write_json_atomic(path, merged)
    path.with_suffix(".md").write_text(merged_markdown(merged))
    return path
