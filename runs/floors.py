"""Traffic floors: how much traffic a run must have sent for its verdict to
rest on something, derived from the plan and stated in the summary.

A verdict judged on too little traffic is empty: a fault window no request
crossed cannot show that the stack rode it out, and a load that sent a
fraction of its plan judged a fraction of the run. Fixed floors ("half the
requests ok", "at least the concurrency") let both pass. Here each floor
comes from the workload's plan:

- ``invoked_min``: an open loop sends every planned request at its due
  time whatever the answers do, so it must have invoked 90% of the requests
  its seeded plan puts inside the load's duration (``planned``; the 10%:
  requests due in the last instants, whose invoke a stop may cut). A closed
  loop has no plan of times: each user must have sent at least one request
  per ``timeout_s`` of the duration (a request ends by its timeout).
- ``window_min``: the requests an open loop invokes while a fault is in
  place (its inject ended, its heal not begun) are Poisson-like with mean
  ``rate x seconds``; a window must see that mean less five standard
  deviations (so an honest run misses it about once in a million windows),
  and nothing where that is below one (a window too short for the rate to
  promise traffic is shown, not judged).
- ``ok_min`` (for the suites, not the verdict: error budgets belong to the
  SLO checkers): the requests no fault could touch (steady state and the
  warm-up; after a heal is ``recovery``'s to judge) succeeded, less the
  steady error budget.

``traffic_floor`` is then "unknown" (could not see) when a floor is not
met, never False: too little traffic says nothing about the stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from invariants import Result
from load.plan import plan_requests
from load.spec import WorkloadSpec

#: Past this many planned requests the plan is not walked (a 72-hour run):
#: its count is taken as rate x duration, the plan's own expectation.
PLAN_WALK_LIMIT = 200_000
INVOKED_SHARE = 0.9
SIGMAS = 5.0


def planned_requests(spec: WorkloadSpec) -> int | None:
    """How many requests an open loop's seeded plan puts inside its
    duration (None for a closed loop)."""
    if spec.mode != "open":
        return None
    if spec.rate * spec.duration_s > PLAN_WALK_LIMIT:
        return int(spec.rate * spec.duration_s)
    return sum(1 for _ in plan_requests(spec, limit_s=spec.duration_s))


def invoked_floor(spec: WorkloadSpec) -> tuple[int, str]:
    """The fewest requests the load must have invoked, and why."""
    planned = planned_requests(spec)
    if planned is not None:
        return (math.floor(INVOKED_SHARE * planned),
                f"{INVOKED_SHARE:.0%} of the {planned} requests the seeded plan puts in "
                f"{spec.duration_s:g} s")
    per_user = max(1, int(spec.duration_s // spec.timeout_s))
    return (spec.concurrency * per_user,
            f"{spec.concurrency} closed-loop user(s) x {per_user} (one request per "
            f"{spec.timeout_s:g} s timeout in {spec.duration_s:g} s)")


def window_floor(spec: WorkloadSpec, seconds: float) -> int:
    """The fewest requests a fault window of ``seconds`` (the fault in
    place) must see invoked: see the module docstring."""
    if spec.mode != "open" or seconds <= 0:
        return 0
    mean = spec.rate * seconds
    return max(0, math.floor(mean - SIGMAS * math.sqrt(mean)))


@dataclass
class TrafficCount:
    """What the history says, counted in the run's one pass."""

    invoked: int = 0
    ok: int = 0
    untouched: int = 0  # requests of the steady state and the warm-up
    untouched_ok: int = 0
    # window label -> [requests invoked while in place, seconds in place]
    windows: dict[str, list[float]] = field(default_factory=dict)


def judge_floors(spec: WorkloadSpec | None, count: TrafficCount,
                 max_error_rate: float = 0.0) -> tuple[Result, dict[str, Any]]:
    """``traffic_floor`` and the floors as summary.json states them;
    ``max_error_rate``: the steady-state error budget ([slo]) that
    ``ok_min`` leaves to the requests no fault touched."""
    if spec is None:
        return Result("traffic_floor", "unknown", {"why": "no load was run"}), {}
    invoked_min, why = invoked_floor(spec)
    floors: dict[str, Any] = {
        "planned": planned_requests(spec), "invoked_min": invoked_min, "invoked_why": why,
        "invoked": count.invoked, "ok": count.ok,
        "ok_min": math.ceil(count.untouched * (1.0 - max_error_rate)),
        "ok_why": f"the {count.untouched} request(s) of the steady state and the warm-up "
                  f"(no fault window or after-heal window held them), less the "
                  f"{max_error_rate:.1%} error budget",
        "untouched_ok": count.untouched_ok, "windows": {}}
    short: list[dict[str, Any]] = []
    for label, (seen, seconds) in count.windows.items():
        need = window_floor(spec, seconds)
        floors["windows"][label] = {"invoked": int(seen), "min": need,
                                    "in_place_s": round(seconds, 3)}
        if seen < need:
            short.append({"window": label, "invoked": int(seen), "min": need,
                          "in_place_s": round(seconds, 3)})
    problems = []
    if count.invoked < invoked_min:
        problems.append(f"invoked {count.invoked} < {invoked_min} ({why})")
    if short:
        problems.append(f"{len(short)} fault window(s) saw fewer requests than the plan "
                        f"promises while the fault was in place")
    details = {"invoked": count.invoked, "invoked_min": invoked_min,
               "windows_judged": sum(1 for w in floors["windows"].values() if w["min"] > 0),
               "windows_short": short[:20]}
    if problems:
        details["why"] = "; ".join(problems) + ": too little traffic to judge the run"
        return Result("traffic_floor", "unknown", details, short[:20]), floors
    return Result("traffic_floor", True, details), floors
