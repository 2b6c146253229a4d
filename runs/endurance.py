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

import copy
import json
import math
import os
import random
import threading
import time
import tracemalloc
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from faults.catalogue import backend_kinds, common_kinds
from faults.nemesis import FaultWindow
from faults.schedule import FaultChoice, Step, plan_schedule
from faults.targets import select
from invariants import DEFAULT_CHECKERS, RunContext, with_planted
from invariants.base import Result, not_judgeable
from invariants.drift import Drift, Series
from invariants.settings import CheckerSettings
from load import heap
from load.router_watch import RouterGone
from load.workload import WorkloadSpec
from ordeal import kinds as kind_traits
from ordeal.config import ConfigError
from ordeal.history.ops import HARNESS, MONITOR, Op
from ordeal.history.reader import HistoryTail
from ordeal.history.windows import INJECTED, FaultWindows, Window
from ordeal.history.writer import History
from reports.html import MAX_INTERIM_FAULTS, render_interim
from reports.run_dir import write_json_atomic
from runs.run import checker_context

STATE_NAME = "endurance.json"
INTERIM_NAME = "interim.json"
FORMAT_VERSION = 1

def all_choices() -> tuple[FaultChoice, ...]:
    """Every kind that declares an endurance choice (``KindTraits.endurance``:
    parameters a healthy two-replica stack behind a router should ride out),
    in cycle order. Link faults go on a router-replica link: the router may
    retry elsewhere, which is what a qualification wants to see. lsn_jump
    plants a corruption on purpose; invariants.planted judges it as
    detection."""
    chosen = [(t.endurance, t.kind) for t in kind_traits.traits().values()
              if t.endurance is not None]
    chosen.sort(key=lambda pair: (pair[0].position, pair[1]))
    return tuple(FaultChoice(kind, e.target, dict(e.params)) for e, kind in chosen)


def default_choices() -> tuple[FaultChoice, ...]:
    """The default cycle: every kind every backend has. A backend's own
    kinds (``--cluster ray``'s simulated node lost, paused, cut from the
    head) are taken only when ``--faults`` names them, on a cluster of that
    backend the suite started."""
    only_some = set(backend_kinds())
    return tuple(c for c in all_choices() if c.kind not in only_some)


@dataclass(frozen=True)
class StopCondition:
    """Abort the run, healing everything, when the share of client requests
    that end in fail or info over the last ``window_s`` stays above
    ``max_error_rate`` for ``grace_s`` (the stop conditions of cloud fault
    services). The defaults stop only a cluster that is essentially down."""

    max_error_rate: float = 0.9
    window_s: float = 60.0
    grace_s: float = 300.0
    min_requests: int = 10  # fewer completions in the window judge nothing

    def __post_init__(self) -> None:
        if not 0 < self.max_error_rate <= 1:
            raise ConfigError(f"--stop-error-rate {self.max_error_rate}: give a share in (0, 1]")
        if self.window_s <= 0 or self.grace_s < 0:
            raise ConfigError(f"stop condition: window {self.window_s}s must be > 0 and grace "
                              f"{self.grace_s}s >= 0")


@dataclass(frozen=True)
class EndurancePlan:
    duration_s: float  # nominal: the schedule's own time
    time_scale: float = 1.0  # the run takes duration_s / time_scale seconds
    seed: int = 0
    kinds: tuple[str, ...] = field(default_factory=lambda: tuple(c.kind for c in default_choices()))
    rate: float = 8.0  # open-loop requests/s
    replicas: int = 2
    quiet_s: tuple[float, float] = (30.0, 60.0)  # nominal, between faults
    hold_s: tuple[float, float] = (20.0, 40.0)  # nominal, how long a fault stays
    tail_s: float = 60.0  # nominal: no fault in the last tail_s
    interim_every_s: float = 300.0  # wall seconds
    progress_every_s: float = 30.0  # wall seconds
    stop: StopCondition = field(default_factory=StopCondition)
    # Wall-clock floors for a compressed run (--time-scale): a fault held
    # 0.3 s or a quiet of 0.5 s (72 h at x72) shows nothing and leaves no
    # after-heal window, and 287 restarts of ~30 s each cannot fit in an
    # hour. When a scaled hold or quiet falls below these, the schedule is
    # thinned (``thin``): it keeps fewer faults, each with its nominal time,
    # parameters and target, the kinds still taken in turn.
    # The defaults are the nominal minimums at --time-scale 20, the most
    # compressed schedule CI runs: shorter holds and quiets are untested.
    min_hold_wall_s: float = 1.0
    min_quiet_wall_s: float = 1.5
    restart_wall_s: float = 45.0  # kept free after a heal that restarts (restarts_target)
    # A fault must meet enough requests for its effect and the window's
    # figures to be seen: at 1 req/s a 1 s hold met 0-5 (72 h at x72, the
    # long-output workload). The hold floor is at least this many requests
    # at ``rate`` (8 at the default 8 req/s: x20's 1 s, unchanged).
    min_window_requests: float = 8.0
    # The checkers' after-heal window (SLOTargets.after_heal_s, set from the
    # run's --slo). A compressed plan keeps a steady stretch before its first
    # fault and after each cycle of kinds (``steady_gap_s``): without one,
    # every after-heal window ran into the next fault and no request was
    # steady-state, so slo_latency, goodput and error_rate had nothing to
    # judge (72 h at x72, 2026-12-03: `unknown`).
    after_heal_window_s: float = 30.0

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ConfigError(f"--time-scale {self.time_scale}: must be more than zero")
        if self.duration_s <= 0:
            raise ConfigError(f"--duration {self.duration_s}s: must be more than zero")
        choices = all_choices()
        unknown = sorted(set(self.kinds) - {c.kind for c in choices})
        if unknown or not self.kinds:
            raise ConfigError(f"--faults: unknown kind(s) {unknown or ['(none given)']}; choose "
                              f"from {', '.join(c.kind for c in choices)}")
        if self.replicas < 1:
            raise ConfigError("endurance needs at least one replica")
        if min(self.min_hold_wall_s, self.min_quiet_wall_s, self.restart_wall_s,
               self.min_window_requests, self.after_heal_window_s) < 0:
            raise ConfigError("endurance: the wall-clock floors (min hold, min quiet, restart "
                              "time, requests per window, after-heal window) must be 0 or "
                              "more")
        if not self.rate > 0:
            raise ConfigError(f"endurance: a rate of {self.rate} req/s; give --load-rate (or a "
                              "workload file's [arrival] rate) above 0")

    @property
    def hold_floor_s(self) -> float:
        """The shortest hold a compressed schedule keeps, in wall seconds:
        ``min_hold_wall_s``, or longer where the rate needs it to meet
        ``min_window_requests``."""
        return max(self.min_hold_wall_s, self.min_window_requests / self.rate)

    @property
    def quiet_floor_s(self) -> float:
        """The shortest quiet a thinned schedule keeps before a fault, in
        wall seconds: ``min_quiet_wall_s``, or longer where the rate needs
        it for ``min_window_requests`` after the previous heal (recovery is
        judged on them; 72 h at x72, 1 req/s: 6 of 173 windows met none in
        quiets from 1.5 s)."""
        return max(self.min_quiet_wall_s, self.min_window_requests / self.rate)

    def hold_floor_for(self, kind: str) -> float:
        """``hold_floor_s``, times the replicas for a kind seen only in its
        target's own answers (``KindTraits.observed_in_answers``: clock_drift,
        in their ``created`` stamp), which get 1/N of the requests (72 h at
        x72, 1 req/s: 2 of 14 clock_drift windows met no answer of their
        replica in 8 s)."""
        traits = kind_traits.of(kind)
        seen_in_answers = traits is not None and traits.observed_in_answers
        return self.hold_floor_s * (self.replicas if seen_in_answers else 1)

    @property
    def steady_gap_s(self) -> float:
        """The quiet a compressed schedule keeps before its first fault and
        after each cycle of kinds: the after-heal window, then
        ``min_window_requests`` at ``rate`` that no fault window holds."""
        return self.after_heal_window_s + self.min_window_requests / self.rate

    @property
    def run_s(self) -> float:
        """Wall seconds the load runs."""
        return self.duration_s / self.time_scale

    def choices(self) -> list[FaultChoice]:
        return [c for c in all_choices() if c.kind in self.kinds]

    def schedule(self) -> list[Step]:
        """The whole run's steps, at scaled times, targets resolved to names."""
        nominal = plan_schedule(self.choices(), self.duration_s, self.seed, self.quiet_s,
                                self.hold_s, self.tail_s, cycle=True)
        if not nominal:
            raise ConfigError(f"--duration {self.duration_s:.0f}s leaves no room for a fault "
                              f"(quiet {self.quiet_s}, hold {self.hold_s}, tail {self.tail_s}s "
                              "nominal); give a longer duration")
        replicas = [f"replica-{i}" for i in range(self.replicas)]
        rng = random.Random(self.seed)
        names: dict[int, str] = {}
        out = []
        for s in nominal:
            if s.key not in names:
                # A Ray node kind keeps its word: the plan does not know how
                # many Ray nodes the cluster has; the factory picks among
                # them at injection, with the run's seeded random.
                traits = kind_traits.of(s.kind)
                keep = traits is not None and (traits.on_link or bool(traits.backends))
                names[s.key] = s.target if keep \
                    or s.target not in ("one", "minority", "majority", "all") else ",".join(
                        select(s.target, replicas, rng))
            out.append(replace(s, at_s=round(s.at_s / self.time_scale, 3),
                               target=names[s.key]))
        return self.thin(out)[0]

    def floors_bind(self, steps: Sequence[Step]) -> bool:
        """Whether a scaled hold or quiet of ``steps`` is under its floor."""
        t = 0.0
        for inject, heal in pairs_of(steps):
            if heal.at_s - inject.at_s < self.hold_floor_s - 1e-9 or \
                    inject.at_s - t < self.min_quiet_wall_s - 1e-9:
                return True
            t = heal.at_s
        return False

    def thin(self, steps: Sequence[Step]) -> tuple[list[Step], dict[str, Any] | None]:
        """``steps`` (scaled) as they fit the wall-clock floors, and what was
        done (None: they fit as they are). The rule: walk the faults in
        order; the next one kept is the first of the next kind in turn that
        the plan puts after the previous one ended (its heal, plus
        ``restart_wall_s`` after a restart), moved later if needed to leave
        ``quiet_floor_s`` of quiet, and held ``max(its hold,
        hold_floor_for(kind))``; none is kept that would end within the tail. The
        first fault, and the first of each new cycle of kinds, is picked
        only after ``steady_gap_s`` more, so the run has steady-state
        requests to judge the SLO by. So a kept fault runs at its nominal
        (scaled) time or at most a quiet later, with its parameters and
        target: the run stays aligned with the plan it rehearses."""
        if not self.floors_bind(steps):
            return list(steps), None
        pairs = pairs_of(steps)
        order = list(dict.fromkeys(i.kind for i, _ in pairs))
        last_end = self.run_s - max(self.tail_s / self.time_scale, self.min_quiet_wall_s)
        kept: list[Step] = []
        restarting = kind_traits.restarting_kinds()
        t, turn, i = self.steady_gap_s, 0, 0
        while i < len(pairs) and order:
            want = order[turn % len(order)]
            j = next((j for j in range(i, len(pairs))
                      if pairs[j][0].kind == want and pairs[j][0].at_s >= t), None)
            if j is None:
                break
            inject, heal = pairs[j]
            at = round(max(inject.at_s, t + self.quiet_floor_s), 3)
            at_heal = round(at + max(heal.at_s - inject.at_s, self.hold_floor_for(inject.kind)), 3)
            allow = self.restart_wall_s if inject.kind in restarting else 0.0
            end = at_heal + allow
            if end > last_end:
                break
            # The heal's step says it has `allow` s: the nemesis then pushes
            # the schedule back only by a restart slower than that.
            kept += [replace(inject, at_s=at), replace(heal, at_s=at_heal, allow_s=allow)]
            turn, i = turn + 1, j + 1
            t = end + (self.steady_gap_s if turn % len(order) == 0 else 0.0)
        per_kind = Counter(s.kind for s in kept if s.action == "inject")
        return kept, {
            "why": (f"at --time-scale {self.time_scale:g} a scaled hold or quiet falls under "
                    f"the wall-clock floors (hold {self.hold_floor_s:g} s"
                    + (f": {self.min_window_requests:g} requests at {self.rate:g} req/s"
                       if self.hold_floor_s > self.min_hold_wall_s else "")
                    + (f", {self.hold_floor_for('clock_drift'):g} s for clock_drift (seen in "
                       f"its replica's answers)" if "clock_drift" in per_kind
                       and self.replicas > 1 else "")
                    + f", quiet {self.quiet_floor_s:g} s"
                    + (f" ({self.min_window_requests:g} requests after each heal)"
                       if self.quiet_floor_s > self.min_quiet_wall_s else "")
                    + f", {self.restart_wall_s:g} s after a restart; "
                    f"{self.steady_gap_s:g} s steady before each cycle of kinds)"),
            "nominal_faults": len(pairs), "kept_faults": len(kept) // 2,
            "kept_per_kind": dict(per_kind)}

    def thinning(self) -> dict[str, Any] | None:
        """What ``thin`` did to this plan's schedule (None: nothing)."""
        nominal = [replace(s, at_s=round(s.at_s / self.time_scale, 3))
                   for s in self._nominal(self.duration_s)]
        return self.thin(nominal)[1]

    def _nominal(self, duration_s: float) -> list[Step]:
        return plan_schedule(self.choices(), duration_s, self.seed, self.quiet_s, self.hold_s,
                             self.tail_s, cycle=True)

    def shortest_duration_s(self) -> int:
        """The shortest ``--duration`` (whole nominal seconds) whose schedule
        injects every kind of the plan, at this seed and spacing. Derived
        from the planner: its draws do not depend on the duration, and it
        cycles the kinds in turn, so every kind is in once the n-th fault
        heals ``tail_s`` before the end. The time scale divides the times
        only: the wall time is this over ``time_scale``."""
        n = len(self.choices())
        # Each fault takes at most max quiet + max hold: this bound holds n.
        bound = n * (self.quiet_s[1] + self.hold_s[1]) + self.tail_s + 1
        heals = sorted(s.at_s for s in self._nominal(bound) if s.action == "heal")
        shortest = math.ceil(heals[n - 1] + self.tail_s)
        while len({s.kind for s in self._nominal(shortest)}) < n:  # float edge: a second more
            shortest += 1
        return shortest

    def require_every_kind(self) -> None:
        """ConfigError, at startup, when the schedule cannot inject every kind
        asked for (it would run, and fail at the end with kinds missing): how
        many fit, which are left out, and the shortest ``--duration`` that
        fits them all."""
        kinds = [c.kind for c in self.choices()]
        planned = {s.kind for s in self._nominal(self.duration_s)}
        thinned = self.thinning()
        if planned >= set(kinds) and thinned is not None \
                and set(thinned["kept_per_kind"]) < set(kinds):
            raise ConfigError(
                f"--duration {self.duration_s:g}s at --time-scale {self.time_scale:g}: "
                f"{thinned['why']}, so the schedule was thinned to {thinned['kept_faults']} of "
                f"{thinned['nominal_faults']} faults, and these kinds never come: "
                f"{', '.join(k for k in kinds if k not in thinned['kept_per_kind'])}. Give a "
                f"smaller --time-scale (a longer wall time), a higher request rate, or name "
                f"fewer kinds with --faults.")
        if planned >= set(kinds):
            return
        shortest = self.shortest_duration_s()
        scale = f"{self.time_scale:g}"
        raise ConfigError(
            f"--duration {self.duration_s:g}s: the endurance schedule fits {len(planned)} of the "
            f"{len(kinds)} fault kinds asked for (--seed {self.seed}); left out: "
            f"{', '.join(k for k in kinds if k not in planned)}. The shortest --duration that "
            f"fits all {len(kinds)} is {shortest}s ({shortest / 60:.1f}m nominal; "
            f"{shortest / self.time_scale:.0f} s of wall time at --time-scale {scale}): run "
            f"with --duration {shortest}s (or longer), or name fewer kinds with --faults.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "EndurancePlan":
        kw = dict(d)
        kw["stop"] = StopCondition(**kw.get("stop", {}))
        for k in ("kinds", "quiet_s", "hold_s"):
            if k in kw:
                kw[k] = tuple(kw[k])
        return EndurancePlan(**kw)


def pairs_of(steps: Sequence[Step]) -> list[tuple[Step, Step]]:
    """Each inject with its heal, in the order of the injects."""
    heals = {s.key: s for s in steps if s.action == "heal"}
    return [(s, heals[s.key]) for s in sorted(steps, key=lambda s: s.at_s)
            if s.action == "inject" and s.key in heals]


def kinds_option(text: str | None, backend: str = "local") -> tuple[str, ...]:
    """``--faults a,b``: the kinds to cycle through; all of the common
    catalogue when not given. A Ray node kind needs ``--cluster ray``."""
    if not text or text.strip() == "all":
        return tuple(c.kind for c in default_choices())
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    common, only_ray = common_kinds(), backend_kinds()
    unknown = [k for k in kinds if k not in common and k not in only_ray]
    if unknown:
        raise ConfigError(f"--faults: unknown kind(s) {unknown}; the catalogue has "
                          f"{', '.join(common)}, and on --cluster ray "
                          f"{', '.join(only_ray)}")
    ray_only = [k for k in kinds if k in only_ray]
    if ray_only and backend != "ray":
        raise ConfigError(f"--faults: {ray_only} act on the simulated nodes of --cluster ray; "
                          f"this run is --cluster {backend}. Add --cluster ray, or leave them "
                          "out")
    return kinds


# ------------------------------------------------------------------ state

@dataclass
class EnduranceState:
    """What endurance.json keeps: enough to resume the run from its plan."""

    plan: EndurancePlan
    steps: list[Step]
    segments: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "ordeal-endurance", "version": FORMAT_VERSION,
                "plan": self.plan.to_dict(), "steps": [s.to_dict() for s in self.steps],
                "segments": self.segments}


def save_state(run_dir: Path, state: EnduranceState) -> None:
    write_json_atomic(Path(run_dir) / STATE_NAME, state.to_dict())


def load_state(run_dir: Path) -> EnduranceState:
    """The state of a run to resume; every problem says what to do."""
    path = Path(run_dir) / STATE_NAME
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no {STATE_NAME} there; give the run directory "
                          "of an endurance run (reports/runs/<run-id>)")
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != "ordeal-endurance" or doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        plan = EndurancePlan.from_dict(doc["plan"])
        steps = [Step(**s) for s in doc["steps"]]
        return EnduranceState(plan, steps, list(doc.get("segments", [])))
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--resume {run_dir}: {path} cannot be read ({e}); it is written by "
                          "suites/test_endurance.py and must not be edited") from None


def os_threads() -> int:
    """The harness's threads as the kernel counts them (Python's own and
    those of native libraries), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def epoch_of(wall: str) -> float:
    return datetime.fromisoformat(wall.replace("Z", "+00:00")).timestamp()


def remaining_steps(steps: Sequence[Step], position_s: float) -> list[Step]:
    """The steps still to run from ``position_s`` on, shifted to start at 0.
    An inject before the position was healed by the clean-up of the resumed
    run (heal-all), so its heal is dropped with it."""
    done_keys = {s.key for s in steps if s.action == "inject" and s.at_s < position_s}
    return [replace(s, at_s=round(s.at_s - position_s, 3)) for s in steps
            if s.at_s >= position_s and s.key not in done_keys]


harness_rss_mb = heap.rss_mb


# ------------------------------------------------------------------ judge

class Judge:
    """Judges the run while it goes, from history.jsonl as written: a thread
    follows it (``HistoryTail``: each chunk once sealed and verified) and
    feeds every op once to streaming checkers, so memory stays bounded by
    the checkers' own (in-flight) state. Every
    ``interim_every_s`` it writes interim.json; every ``progress_every_s`` it
    prints a line; it decides the stop condition on the current segment's
    client completions. A resumed run's judge starts at the beginning of
    the file, so the figures cover both halves."""

    MAX_WINDOWS = 20000  # ~ a fault a minute for two weeks

    def __init__(self, history_path: Path, run_dir: Path, plan: EndurancePlan,
                 ctx: RunContext, say: Callable[[str], None], live_from_index: int = 0,
                 position_s: float = 0.0, checkers: Sequence[Any] | None = None):
        self.path = Path(history_path)
        self.run_dir = Path(run_dir)
        self.plan = plan
        self.ctx = ctx
        self.say = say
        self.live_from_index = live_from_index
        self.position_s = position_s
        self.checkers = list(checkers) if checkers is not None else [c() for c in
                                                                       DEFAULT_CHECKERS]
        for c in self.checkers:
            c.start(ctx)
        self.failed_checkers: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.damage = 0  # damaged lines or chunks the tail reported (the final check names them)
        self.tail = HistoryTail(self.path, on_error=self._damaged, on_note=lambda _m: None)
        self.faults = FaultWindows(keep=self.MAX_WINDOWS)
        self.exercised: Counter[str] = Counter()
        self.gaps: list[dict[str, Any]] = []
        self.recent: deque[tuple[int, bool]] = deque()  # (time_ns, failed) of live completions
        self.breach_since_ns: int | None = None
        self.stop_reason: str | None = None
        self.rss: list[tuple[float, float]] = []  # (seconds into this segment, MB)
        # (wall time, RSS MB, open fds, threads) of the harness, for the drift
        # figures (wall time, so a resumed run's segments line up)
        self.harness: list[tuple[float, float, int, int]] = []
        self.heap: dict[str, Any] = {}  # the latest sample_rss's figures
        self.t0 = time.monotonic()
        # ORDEAL_TRACEMALLOC=1: interim.json also lists the lines holding the
        # most memory (slows the harness; for finding a leak).
        self.trace = bool(os.environ.get("ORDEAL_TRACEMALLOC"))
        if self.trace and not tracemalloc.is_tracing():
            tracemalloc.start(4)
        self._trace_base: tracemalloc.Snapshot | None = None
        #: Called with the interim results each time interim.json is written
        #: (the run's live metrics, runs/live_metrics.py).
        self.on_interim: Callable[[list[Result]], None] | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ordeal-judge", daemon=True)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, read what is left (the writer is done: its
        unsealed tail too), write the last interim file."""
        self._halt.set()
        self._thread.join(timeout=60)
        for op in self.tail.read_rest():
            self.feed(op)
        self.write_interim()

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def _loop(self) -> None:
        next_interim = time.monotonic() + self.plan.interim_every_s
        next_progress = time.monotonic() + self.plan.progress_every_s
        while not self._halt.wait(0.5):
            try:
                self.read_new()
                now = time.monotonic()
                if now >= next_progress:
                    next_progress = now + self.plan.progress_every_s
                    self.say(self.progress_line())
                    heap.trim()  # the line's copy of the checkers is garbage now
                if now >= next_interim:
                    next_interim = now + self.plan.interim_every_s
                    self.write_interim()
            except Exception as e:  # noqa: BLE001 - the judge must not kill the run
                self.say(f"endurance: judge error (the run goes on; the final check reads "
                         f"the whole history again): {type(e).__name__}: {e}")

    # -- reading ----------------------------------------------------------------
    def read_new(self) -> int:
        """Feed the ops of every chunk sealed since the last call."""
        n = 0
        for op in self.tail.read_new():
            self.feed(op)
            n += 1
        return n

    def _damaged(self, _msg: str) -> None:
        self.damage += 1

    def feed(self, op: Op) -> None:
        for c in self.checkers:
            if c.name in self.failed_checkers:
                continue
            try:
                c.feed(op)
            except Exception as e:  # noqa: BLE001 - judged again at the end
                self.failed_checkers[c.name] = f"{type(e).__name__}: {e}"
        change = self.faults.feed(op)  # a gap ends the open ones: heal-all healed them
        if change is not None and change.what == INJECTED:
            self.exercised[change.window.kind] += 1
        if op.process in HARNESS:
            if op.process == MONITOR and op.f == "gap":
                self.gaps.append(dict(op.value))
            return
        self.counts[op.type] += 1
        if op.type != "invoke" and op.index >= self.live_from_index:
            self._stop_condition(op)

    def _stop_condition(self, op: Op) -> None:
        stop = self.plan.stop
        self.recent.append((op.time_ns, op.type != "ok"))
        horizon = op.time_ns - int(stop.window_s * 1e9)
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()
        if len(self.recent) < stop.min_requests:
            return
        rate = sum(bad for _, bad in self.recent) / len(self.recent)
        if rate <= stop.max_error_rate:
            self.breach_since_ns = None
            return
        if self.breach_since_ns is None:
            self.breach_since_ns = op.time_ns
        if op.time_ns - self.breach_since_ns >= stop.grace_s * 1e9 and self.stop_reason is None:
            self.stop_reason = (f"stop condition: {rate:.0%} of requests failed over the last "
                                f"{stop.window_s:.0f}s, above {stop.max_error_rate:.0%} for "
                                f"{stop.grace_s:.0f}s (--stop-error-rate, --stop-grace)")
            self.say(f"endurance: {self.stop_reason}; stopping and healing everything")

    # -- reporting --------------------------------------------------------------
    def results(self) -> list[Result]:
        """The invariants so far, without disturbing the running checkers."""
        out = []
        for c in self.checkers:
            if c.name in self.failed_checkers:
                out.append(Result(c.name, "unknown", {"error": self.failed_checkers[c.name]}))
                continue
            try:
                # A copy costs as much as the checker's state, every progress
                # line; a checker whose result only reads is asked directly.
                live = c if c.pure_result else copy.deepcopy(c)
                out.append(not_judgeable(c, settled_so_far(live.result()), self.ctx))
            except Exception as e:  # noqa: BLE001
                out.append(Result(c.name, "unknown", {"error": f"{type(e).__name__}: {e}"}))
        return out

    def elapsed_s(self) -> float:
        return self.position_s + time.monotonic() - self.t0

    def progress_line(self) -> str:
        results = self.results()
        false = [r.name for r in results if r.valid is False]
        elapsed, total = self.elapsed_s(), self.plan.run_s
        active = ", ".join(f"{w.kind} on {w.target}" for w in self.faults.open.values()) or "none"
        unknown = sum(1 for r in results if r.valid not in (True, False))
        verdict = (f"FALSE: {', '.join(false)}" if false else
                   f"none false ({len(results) - unknown} true, {unknown} not yet judged)")
        c = self.counts
        return (f"endurance {fmt_s(elapsed)}/{fmt_s(total)} ({min(100, 100 * elapsed / total):.0f}%),"
                f" ops {c['invoke']} (ok {c['ok']}, fail {c['fail']}, info {c['info']}), fault: "
                f"{active}, kinds {len(self.exercised)}/{len(self.plan.kinds)}, "
                f"invariants so far {verdict}, harness RSS {harness_rss_mb():.0f} MB")

    def sample_rss(self) -> None:
        """RSS after handing malloc's free pages back (``load.heap``),
        with malloc's own figures and what the trim gave back."""
        before = harness_rss_mb()
        heap.trim()
        t, parts = round(time.monotonic() - self.t0, 1), heap.rss_parts_mb()
        after = parts.get("VmRSS", 0.0)
        if len(self.rss) < 2000:
            self.rss.append((t, round(after, 2)))
        if len(self.harness) < 20000:
            self.harness.append((round(time.time(), 1), round(after, 2),
                                 len(os.listdir("/proc/self/fd")), os_threads()))
        self.heap = {"at_s": t, "rss_before_trim_mb": round(before, 2),
                     "rss_mb": round(after, 2),
                     "rss_anon_mb": round(parts.get("RssAnon", 0.0), 2),
                     "rss_file_mb": round(parts.get("RssFile", 0.0), 2),
                     **(heap.malloc_figures() or {})}

    def write_interim(self) -> None:
        self.sample_rss()
        results = self.results()
        if self.on_interim is not None:
            self.on_interim(results)
        doc = {
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "elapsed_s": round(self.elapsed_s(), 1), "run_s": self.plan.run_s,
            "ops": dict(self.counts),
            "active_faults": [[w.kind, w.target] for w in self.faults.open.values()],
            "kinds_exercised": dict(self.exercised), "stop_reason": self.stop_reason,
            "harness_rss_mb": self.rss[-20:], "history_damage": self.damage,
            "invariants": [r.to_dict() for r in results],
            "threads": threading.active_count(), "heap": self.heap,
            **(self.trace_report() if self.trace else {})}
        write_json_atomic(self.run_dir / INTERIM_NAME, doc)
        # report.html marked interim, from the same figures (never raises);
        # the run's end writes the final one over it.
        render_interim(self.run_dir, doc, [asdict(summary_window(w)) for w in
                                           self.faults.windows[-MAX_INTERIM_FAULTS:]])

    def trace_report(self) -> dict[str, Any]:
        """ORDEAL_TRACEMALLOC=1: what Python holds now, and what grew since
        the first interim file (a leak shows in the growth, not the top)."""
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        if self._trace_base is None:
            self._trace_base = snap
        current, peak = tracemalloc.get_traced_memory()
        return {"tracemalloc_traced_mb": round(current / 2**20, 2),
                "tracemalloc_peak_mb": round(peak / 2**20, 2),
                "tracemalloc_top": [str(st) for st in snap.statistics("lineno")[:25]],
                "tracemalloc_growth": [
                    f"{st.size_diff / 1024:+.1f} KiB ({st.count_diff:+d} blocks) at "
                    + " -> ".join(f"{fr.filename}:{fr.lineno}" for fr in st.traceback)
                    for st in snap.compare_to(self._trace_base, "traceback")[:15]]}

    def section(self, state: EnduranceState) -> dict[str, Any]:
        """summary.json's ``endurance`` key."""
        missing = [k for k in self.plan.kinds if not self.exercised.get(k)]
        return {"plan": self.plan.to_dict(), "segments": state.segments, "gaps": self.gaps,
                "kinds_exercised": dict(self.exercised), "kinds_missing": missing,
                "stopped": self.stop_reason, "harness_rss_mb": self.rss,
                "harness_samples": self.harness,
                "faults_total": len(self.faults.windows)}

    def fault_windows(self) -> list[dict[str, Any]]:
        """summary.json's ``faults``: the windows as the nemesis records them."""
        return [asdict(summary_window(w)) for w in self.faults.windows]


def summary_window(w: Window) -> FaultWindow:
    """A window of the history as a summary's fault (``faults.nemesis``);
    the action results stay in the history."""
    error = w.inject_error
    if w.heal_error:
        error = (error or "") + f" heal: {w.heal_error}"
    return FaultWindow(w.kind, w.target, injected=w.injected_wall, healed=w.end_wall, error=error,
                       note="healed by the resumed harness's clean-up" if w.ended_by_gap else None)


def settled_so_far(r: Result) -> Result:
    """A checker's result mid-run, without what only the end can settle: a
    request still in flight is not lost yet, and a fault still injected has
    not failed to recover yet. The final check judges both for real."""
    if r.name == "no_silent_loss" and r.valid is False:
        d = r.details
        if not any(d.get(k) for k in ("completion_without_invoke", "invoke_while_open")):
            return Result(r.name, True, {**d, "in_flight": d.get("never_completed", 0),
                                         "never_completed": 0})
    if r.name == "recovery" and r.valid is False:
        windows = r.details.get("windows", {})
        if all(w.get("recovered") is not False or w.get("why") == "never healed"
               for w in windows.values()):
            return Result(r.name, True, {**r.details, "note": "a fault is still injected"})
    return r


def fmt_s(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


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
