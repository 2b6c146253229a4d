"""summary.json: the run's verdict and what it rests on. Later work adds
keys; the keys written here stay, with the same meaning, but for one
widening (2026-12-06, issue 47): ``verdict`` is over the invariants judged,
and ``scope`` names those the cluster could not give the data for (on
Ordeal's own clusters there are none, and nothing changed)."""

from __future__ import annotations

from typing import Any, Collection, Iterable

SCHEMA_VERSION = 1


def not_judgeable(invariant: dict[str, Any]) -> dict[str, str]:
    """What an invariant of summary.json could not be judged without, and
    why (``details.not_judgeable``: the cluster cannot give that data, an
    external deployment's replicas name no one, say); empty when it was
    judged. Only an "unknown" counts: a False stands on the data it had."""
    if invariant.get("valid") != "unknown":
        return {}
    missing = (invariant.get("details") or {}).get("not_judgeable")
    return dict(missing) if isinstance(missing, dict) and missing else {}


def scope_of(invariants: list[dict[str, Any]],
             require_judged: Collection[str] = ()) -> dict[str, Any]:
    """What the verdict covers (issue 47): the invariants judged, and each
    one this cluster could not give the data for, with why and whether
    ``--require-judged`` names it. A verdict is ``pass`` only over
    ``judged``; a required invariant left out makes it ``unknown``, so a CI
    that needs failover judged never gets a ``pass`` without it."""
    not_judged = {}
    for i in invariants:
        missing = not_judgeable(i)
        if missing:
            not_judged[str(i.get("name"))] = {
                "why": "; ".join(f"{need}: {why}" for need, why in missing.items()),
                "required": i.get("name") in require_judged}
    ran = {str(i.get("name")) for i in invariants}
    for name in sorted(set(require_judged) - ran):  # required, and no checker of this run judged it
        not_judged[name] = {"why": "no checker of this run judges it (not run here)",
                            "required": True}
    return {"complete": not not_judged,
            "judged": [str(i.get("name")) for i in invariants
                       if str(i.get("name")) not in not_judged],
            "not_judged": not_judged,
            "require_judged": sorted(require_judged)}


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


def judge_verdict(invariants: list[dict[str, Any]], errors: Collection[str] = (),
                  require_judged: Collection[str] = ()) -> tuple[str, dict[str, Any]]:
    """The run's verdict and its ``scope``. A known finding counts as held;
    an invariant the cluster cannot give the data for is left out and
    named in the scope, unless ``require_judged`` names it (then it stays,
    "unknown"); a harness error makes it "unknown"."""
    scope = scope_of(invariants, require_judged)
    left_out = {n for n, v in scope["not_judged"].items() if not v["required"]}
    verdicts = [True if i.get("known") else i.get("valid") for i in invariants
                if str(i.get("name")) not in left_out]
    absent = ["unknown" for n in require_judged if n not in {str(i.get("name"))
                                                             for i in invariants}]
    return verdict_of(verdicts + absent + (["unknown"] if errors else [])), scope


def build_summary(*, run_id: str, suite: str, started: str, ended: str,
                  cluster: dict[str, Any], counts: dict[str, int],
                  nemesis_counts: dict[str, int], faults: list[dict[str, Any]],
                  invariants: list[dict[str, Any]], workload: dict[str, Any],
                  errors: list[str] | None = None,
                  schedule: list[dict[str, Any]] | None = None,
                  duration_s: float | None = None,
                  segments: list[dict[str, Any]] | None = None,
                  require_judged: Collection[str] = ()) -> dict[str, Any]:
    """``require_judged``: invariants that must be judged for a ``pass``
    (``--require-judged``); ``scope`` in the summary says what was judged
    (``scope_of``), and the verdict rests on those invariants only.

    ``duration_s``: how long the run took by the monotonic clock (the
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
    verdict, scope = judge_verdict(invariants, errors or [], require_judged)
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
        "verdict": verdict,
        "scope": scope,
    }
