"""summary.json: the run's verdict and what it rests on. Later work adds
keys; the keys written here stay, with the same meaning."""

from __future__ import annotations

from typing import Any, Iterable

SCHEMA_VERSION = 1


def verdict_of(valids: Iterable[Any]) -> str:
    """pass only if every invariant is true; fail if any is false;
    otherwise unknown (some invariant could not be judged, or the harness
    itself hit an error, which leaves the evidence incomplete)."""
    values = list(valids)
    if any(v is False for v in values):
        return "fail"
    if values and all(v is True for v in values):
        return "pass"
    return "unknown"


def build_summary(*, run_id: str, suite: str, started: str, ended: str,
                  cluster: dict[str, Any], counts: dict[str, int],
                  nemesis_counts: dict[str, int], faults: list[dict[str, Any]],
                  invariants: list[dict[str, Any]], workload: dict[str, Any],
                  errors: list[str] | None = None,
                  schedule: list[dict[str, Any]] | None = None,
                  duration_s: float | None = None,
                  segments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``duration_s``: how long the run took by the monotonic clock (the
    wall times ``started``/``ended`` are for people: a clock stepped back
    mid-run makes ``ended`` earlier than ``started``).

    ``segments``: a resumed run's segments, one per harness
    (``History.segments``: ``started``, ``ended``, ``duration_s``, and
    ``resumed_from_gap`` after the first); by default the one segment
    ``started`` .. ``ended``. The summary covers the whole run: ``started``
    is the first segment's, ``ended`` the last's, ``duration_s`` the sum of
    the segments' durations, and ``down_s`` the sum of the gaps between
    them (each segment's ``resumed_from_gap.down_s``). Summed per segment
    rather than first start to last end, because each segment's duration
    is on the monotonic clock, which does not survive a restart of the
    harness or a reboot, and the wall clock may have been stepped: the
    wall span is about ``duration_s + down_s``. A segment whose duration is
    unknown (None) makes ``duration_s`` None."""
    if segments:
        started = segments[0].get("started") or started
        durations = [s.get("duration_s") for s in segments]
        duration_s = None if any(d is None for d in durations) else sum(durations)
    else:
        segments = [{"started": started, "ended": ended, "duration_s": None if duration_s is None
                     else round(max(0.0, duration_s), 3)}]
    downs = [(s.get("resumed_from_gap") or {}).get("down_s") for s in segments[1:]]
    return {
        "schema": SCHEMA_VERSION,
        "run_id": run_id,
        "suite": suite,
        "started": started,
        "ended": ended,
        "duration_s": None if duration_s is None else round(max(0.0, duration_s), 3),
        "segments": segments,
        "down_s": round(sum(d for d in downs if isinstance(d, (int, float))), 3),
        "cluster": cluster,
        "workload": workload,
        "ops": {
            "invoked": counts.get("invoke", 0),
            "ok": counts.get("ok", 0),
            "fail": counts.get("fail", 0),
            "info": counts.get("info", 0),
            "nemesis": sum(nemesis_counts.values()),
        },
        "faults": faults,
        "schedule": schedule or [],
        "invariants": invariants,
        "errors": errors or [],
        # A failure the known-findings file covers (``known``, set by
        # invariants.known) is reported as it is and does not fail the run.
        "verdict": verdict_of([True if i.get("known") else i.get("valid") for i in invariants]
                              + (["unknown"] if errors else [])),
    }
