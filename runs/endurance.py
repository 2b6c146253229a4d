"""Endurance runs (issue 7): hours to days of load under a seeded nemesis that
cycles through the fault catalogue, judged while it goes, resumable after the
harness dies.

    EndurancePlan (pure)  ->  endurance.json (the plan, the schedule, segments)
        ->  OrdealRun.load(schedule, stop=judge.should_stop)
        ->  Judge: a thread that tails history.jsonl, feeds the checkers,
            prints progress, writes interim.json, and watches the stop condition
        ->  OrdealRun.check over the whole history (both halves of a resumed run)

The schedule is planned at nominal times (``duration_s``) and then divided by
``time_scale``: the same schedule runs in minutes for CI that runs in hours
for a qualification. Targets are resolved to node and link names when the plan
is made, so a resumed run injects exactly what the first half would have.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from faults.schedule import Step
from invariants import DEFAULT_CHECKERS, with_planted
from invariants.base import Result
from invariants.drift import Drift, Series
from invariants.settings import CheckerSettings
from load.router_watch import RouterGone
from load.spec import WorkloadSpec
from ordeal.history.writer import History
from runs.endurance_judge import Judge, fmt_s
from runs.endurance_plan import EndurancePlan, EnduranceState, load_state, save_state
from runs.run import checker_context


def epoch_of(wall: str) -> float:
    return datetime.fromisoformat(wall.replace("Z", "+00:00")).timestamp()


def remaining_steps(steps: Sequence[Step], position_s: float) -> list[Step]:
    """The steps still to run from ``position_s`` on, shifted to start at 0.
    An inject before the position was healed by the clean-up of the resumed
    run (heal-all), so its heal is dropped with it."""
    done_keys = {s.key for s in steps if s.action == "inject" and s.at_s < position_s}
    return [replace(s, at_s=round(s.at_s - position_s, 3)) for s in steps
            if s.at_s >= position_s and s.key not in done_keys]


def record_segment(state: EnduranceState, run_dir: Path, position_s: float,
                   first_index: int, started_time_ns: int | None = None) -> None:
    """``started_time_ns``: the history's clock (``History.now_ns``) at the
    segment's start, what a resume measures the position with."""
    state.segments.append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "started_epoch": time.time(), "started_time_ns": started_time_ns,
                           "position_s": round(position_s, 3),
                           "first_index": first_index, "pid": os.getpid()})
    save_state(run_dir, state)


def segment_position_s(seg: dict[str, Any], last_time_ns: int | None,
                       last_wall: str | None) -> float:
    """Where in the schedule a segment had got to when its last op was
    written: its start position plus the time since it started, on the
    history's monotonic clock when the segment recorded it (a wall clock
    stepped back mid-run would put the run back in its schedule), else on
    the wall clock (segments written before ``started_time_ns`` existed)."""
    start_ns = seg.get("started_time_ns")
    if isinstance(start_ns, int) and last_time_ns is not None:
        return seg["position_s"] + max(0.0, (last_time_ns - start_ns) / 1e9)
    if last_wall:
        return seg["position_s"] + max(0.0, epoch_of(last_wall) - seg["started_epoch"])
    return float(seg["position_s"])


# ------------------------------------------------------------------ the run

def resume_history(run_dir: Any, say: Callable[[str], None]) -> tuple[History, float, int]:
    """Open a dead run's history to continue it: verify and seal what the
    dead harness wrote, close the requests it left in flight as ``info``
    (they may have run), record the gap, and work out where in the schedule
    the run had got to (its last op's wall time, against the start of the
    segment that wrote it). Returns the history, that position in seconds,
    and the index of the first op of the new segment."""
    state = load_state(run_dir.path)
    history = History.resume(run_dir.history_path,
                             on_error=lambda m: say(f"resume: history damage: {m}"))
    found = history.resumed
    position = 0.0
    if state.segments and (found.last_wall or found.last_time_ns is not None):
        position = segment_position_s(state.segments[-1], found.last_time_ns, found.last_wall)
    position = min(position, state.plan.run_s)
    gap = history.record_gap(reason=f"harness died; resumed by pid {os.getpid()}")
    say(f"resume: {found.ops} op(s) read back ({found.rejected_chunks} chunk(s) rejected, "
        f"{found.sealed_tail_ops} unsealed op(s) sealed, {found.dropped_lines} torn line(s) "
        f"dropped); {gap.value['open_invokes']} request(s) in flight closed as info; down "
        f"{gap.value['down_s']}s; continuing at {fmt_s(position)} of {fmt_s(state.plan.run_s)}")
    return history, position, gap.index

def drift_judged(plan: EndurancePlan, settings: CheckerSettings) -> str | None:
    """None when the run is long enough for ``invariants.drift`` to judge a
    series (``drift_settle_s`` plus ``drift_min_span_h`` of wall time), else
    why it is left out: a short run would make every drift verdict unknown."""
    need_s = settings.drift_settle_s + settings.drift_min_span_h * 3600
    if plan.run_s >= need_s:
        return None
    return (f"not judged: the run lasts {fmt_s(plan.run_s)} of wall time; drift needs "
            f"{fmt_s(need_s)} (drift_settle_s + drift_min_span_h)")


def harness_drift(samples: Sequence[tuple[float, float, int, int]],
                  settings: CheckerSettings) -> dict[str, Any]:
    """The harness's own RSS, descriptors and threads as drift figures (the
    same fit as a node's; shown, not judged: the harness is not the system
    under test, and its growth would say the harness leaks)."""
    if not samples:
        return {}
    bounds = settings.drift_bounds()
    t0 = samples[0][0]
    out: dict[str, Any] = {"t0_wall": datetime.fromtimestamp(t0, timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")}
    for i, (what, unit) in enumerate((("rss_mb", "MB"), ("fds", "count"),
                                      ("threads", "count")), start=1):
        s = Series(unit, bounds.get(what), bucket_s=1.0)
        for sample in samples:
            s.add_point(sample[0] - t0, float(sample[i]))
        fit = s.fit()
        fit["chart"] = [[round(t, 4), y] for t, y in s.points]
        out[what] = fit
    return out


def run_endurance(run: Any, state: EnduranceState, say: Callable[[str], None],
                  position_s: float = 0.0, first_index: int = 0,
                  checkers: Callable[[], list[Any]] | None = None) -> Judge:
    """Run (or continue, from ``position_s``) the plan on ``run`` (an
    OrdealRun), judged live, then judge the whole history once more.
    ``checkers`` makes a fresh checker list (the default: every checker of the
    run's engine, with planted corruption judged as detection)."""
    engine = getattr(run, "engine", None)  # the cluster's engine: its own checkers
    plan = state.plan
    drift_note = drift_judged(plan, run.checker_settings)

    def default_checkers() -> list[Any]:
        out = with_planted(engine.checkers() if engine is not None
                           else [c() for c in DEFAULT_CHECKERS])
        return out + [Drift()] if drift_note is None else out

    make = checkers or default_checkers
    steps = remaining_steps(state.steps, position_s)
    segment = len(state.segments)
    record_segment(state, run.run_dir.path, position_s, first_index, run.history.now_ns())
    run.schedule = [s.to_dict() for s in state.steps]
    injects = [s for s in steps if s.action == "inject"]
    say(f"endurance: {'resuming at ' + fmt_s(position_s) + ' of' if position_s else 'running'} "
        f"{fmt_s(plan.run_s)} (nominal {fmt_s(plan.duration_s)}, time scale "
        f"{plan.time_scale:g}), {len(injects)} fault(s) to go over "
        f"{len({s.kind for s in injects})} kind(s); run dir {run.run_dir.path}")
    thinned = plan.thinning()
    if thinned is not None:
        say(f"endurance: {thinned['why']}: thinned to {thinned['kept_faults']} of "
            f"{thinned['nominal_faults']} faults, each kind in turn "
            f"({min(thinned['kept_per_kind'].values(), default=0)} or more each), "
            "at their nominal times")
    for s in injects[:40]:
        say(f"  {fmt_s(s.at_s + position_s)}  {s.kind} on {s.target} {s.params or ''}")
    if len(injects) > 40:
        say(f"  ... and {len(injects) - 40} more (endurance.json has them all)")
    ctx = checker_context(run.run_id, run.checker_settings, run.cluster)
    judge = Judge(run.run_dir.history_path, run.run_dir.path, plan, ctx, say,
                  live_from_index=first_index, position_s=position_s, checkers=make())

    def interim_to_metrics(results: list[Result]) -> None:
        live = getattr(run, "live_metrics", None)  # started by run.load (--metrics-port)
        if live is not None:
            live.set_invariants(results)
    judge.on_interim = interim_to_metrics
    judge.start()
    remaining = max(1.0, plan.run_s - position_s)
    spec = WorkloadSpec(duration_s=remaining, rate=plan.rate, seed=plan.seed + segment)
    gone: RouterGone | None = None
    try:
        run.load(spec, schedule=steps, schedule_seed=plan.seed,
                 after_heal_s=min(30.0, max(5.0, plan.tail_s / plan.time_scale)),
                 max_s=remaining + 900.0, stop=judge.should_stop,
                 load_progress_every_s=max(60.0, plan.progress_every_s * 10))
    except RouterGone as e:
        gone = e  # stopped and healed; judge what was written, then raise it
    finally:
        try:
            run.history.flush()  # seal the last chunk before the judge reads the rest
        except OSError:
            pass  # the disk is full: the judge reads that chunk unsealed
        judge.close()
        say(judge.progress_line())
    if gone is not None and judge.stop_reason is None:
        judge.stop_reason = str(gone)
    if judge.stop_reason and judge.stop_reason not in run.errors:
        run.errors.append(judge.stop_reason)
    section = judge.section(state)
    section["drift"] = drift_note or "judged: the drift invariant"
    section["thinned"] = thinned
    section["harness_drift"] = harness_drift(judge.harness, run.checker_settings)
    run.summary_extra.update({"endurance": section,
                              "faults": judge.fault_windows()})
    run.check(checkers=make())
    if gone is not None:
        raise gone
    return judge
