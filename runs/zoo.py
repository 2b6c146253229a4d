"""Judging one run of the failure zoo (faults/zoo/): was the planted shape
caught by the default verdict, by which invariants, and how long after it
was planted did the first counterexample happen. Pure: the summary and the
history's op times in, one record out (``suites/test_zoo.py`` writes it;
``python -m bench --only zoo`` turns the records into bench/results/zoo.md).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from load.spec import WorkloadSpec

#: Into the load: the steady state first, then the shape; and the load's length.
PLANT_AT_S = 5.0
LOAD_S = 25.0

#: The records of every zoo run of a runs dir, one JSON object a line.
RESULTS_FILE = "zoo-results.jsonl"


def failed_invariants(summary: dict[str, Any]) -> list[str]:
    """The invariants that are False and not marked as a known finding."""
    return [i["name"] for i in summary.get("invariants", [])
            if i.get("valid") is False and not i.get("known")]


def op_times(history_path: Path, indices: set[int]) -> dict[int, int]:
    """``time_ns`` of the history ops with these indices (a damaged line is
    skipped: this is a figure, not a verdict)."""
    found: dict[int, int] = {}
    if not indices:
        return found
    with history_path.open() as f:
        for line in f:
            try:
                op = json.loads(line)
            except ValueError:
                continue
            if op.get("index") in indices:
                found[op["index"]] = int(op["time_ns"])
    return found


def first_caught_s(summary: dict[str, Any], names: list[str], history_path: Path,
                   planted_ns: int | None) -> float | None:
    """Seconds from the plant to the earliest counterexample of ``names``
    that points at a history op (``index``); None when none does."""
    if planted_ns is None:
        return None
    indices = {c["index"] for i in summary.get("invariants", []) if i["name"] in names
               for c in i.get("counterexamples") or []
               if isinstance(c, dict) and isinstance(c.get("index"), int)}
    times = op_times(history_path, indices)
    if not times:
        return None
    return round((min(times.values()) - planted_ns) / 1e9, 2)


def judge_shape(shape: Any, summary: dict[str, Any], history_path: Path,
                planted_ns: int | None, evidence: dict[str, Any]) -> dict[str, Any]:
    """One zoo record. ``shape`` None is the clean run: it must pass.
    A shape is caught when the verdict is ``fail`` and one of the
    invariants it names (``shape.caught_by``) is among the failures."""
    failed = failed_invariants(summary)
    record: dict[str, Any] = {
        "shape": shape.name if shape is not None else "clean",
        "run_id": summary.get("run_id"), "verdict": summary.get("verdict"),
        "failed": failed, "planted": evidence,
        "ops": summary.get("ops", {}),
    }
    if shape is None:
        record["caught"] = None
        record["false_positive"] = summary.get("verdict") != "pass"
        return record
    by = [n for n in failed if n in shape.caught_by]
    record.update({
        "title": shape.title, "sources": list(shape.sources), "how": shape.how,
        "expected": list(shape.caught_by),
        "caught": summary.get("verdict") == "fail" and bool(by),
        "caught_by": by,
        "first_caught_s": first_caught_s(summary, by or failed, history_path, planted_ns),
    })
    return record


def append_record(runs_dir: Path, record: dict[str, Any]) -> Path:
    path = Path(runs_dir) / RESULTS_FILE
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def table(records: list[dict[str, Any]]) -> str:
    """The zoo's markdown table: the last record of each shape, clean first."""
    last: dict[str, dict[str, Any]] = {}
    for r in records:
        last[r["shape"]] = r
    rows = ["| shape | source | caught by | time to catch | verdict |",
            "|---|---|---|---|---|"]
    clean = last.pop("clean", None)
    for name, r in last.items():
        caught = ", ".join(r.get("caught_by") or []) if r.get("caught") else \
            f"MISSED (failed: {', '.join(r.get('failed') or []) or 'none'})"
        t = r.get("first_caught_s")
        rows.append(f"| {name}: {r.get('title', '')} | {', '.join(r.get('sources') or [])} | "
                    f"{caught} | {'-' if t is None else f'{t:.1f} s'} | {r.get('verdict')} |")
    n = len(last)
    caught_n = sum(1 for r in last.values() if r.get("caught"))
    fp = "not run" if clean is None else (
        f"{'1 false positive' if clean.get('false_positive') else '0 false positives'} "
        f"(verdict {clean.get('verdict')}, failed: "
        f"{', '.join(clean.get('failed') or []) or 'none'})")
    return "\n".join(rows + ["", f"Caught {caught_n} of {n} shapes; clean run: {fp}."])


def run_shape(run: Any, cluster: Any, shape: Any, spec: WorkloadSpec,
              say: Callable[[str], None] = print,
              plant_at_s: float = PLANT_AT_S) -> tuple[dict[str, Any], dict[str, Any]]:
    """One zoo run on ``run`` (an OrdealRun on ``cluster``): the load of
    ``spec``, with ``shape`` (None: the clean run) planted ``plant_at_s``
    into it from a timer thread and removed after the load, whatever
    happened; then the default checkers and the summary. Returns (record,
    summary); the record also says why a plant failed (``plant_error``)."""
    planted: dict[str, Any] = {}
    stack = contextlib.ExitStack()

    def plant() -> None:
        try:
            planted["evidence"] = stack.enter_context(shape.plant(cluster))
            planted["at_ns"] = time.monotonic_ns()
            say(f"zoo: planted {shape.name} ({shape.how})")
        except Exception as e:  # noqa: BLE001 - recorded, and the caller fails on it
            planted["error"] = f"{type(e).__name__}: {e}"

    timer = threading.Timer(plant_at_s, plant) if shape is not None else None
    try:
        if timer is not None:
            timer.start()
        run.load(spec, [], after_heal_s=0.0)
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        stack.close()  # the shape removed: the cluster serves right for the next run
    run.check()
    summary = run.finish()
    record = judge_shape(shape, summary, run.run_dir.history_path, planted.get("at_ns"),
                         planted.get("evidence", {}))
    if "error" in planted:
        record["plant_error"] = planted["error"]
    say(f"zoo: {record['shape']}: verdict {record['verdict']}, failed {record['failed']}"
        + (f", caught by {record['caught_by']} after {record['first_caught_s']} s"
           if record.get("caught") else ""))
    return record, summary


def shape_problems(shape: Any, record: dict[str, Any]) -> list[str]:
    """Why a shape's run does not show it caught (empty: caught)."""
    if record.get("plant_error"):
        return [f"the shape could not be planted: {record['plant_error']}"]
    if not record["planted"].get("hits", 0) > 0:
        return [f"the shape was planted but never acted (nothing to catch): {record['planted']}"]
    if not record["caught"]:
        return [f"FALSE PASS: {shape.name} ({shape.title}; {', '.join(shape.sources)}) was "
                f"planted ({shape.how}) and the verdict is {record['verdict']}; failed "
                f"invariants: {record['failed'] or 'none'}; expected one of "
                f"{list(shape.caught_by)}. Run {record['run_id']}"]
    return []

