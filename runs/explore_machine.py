"""The Hypothesis state machine that explores fault schedules (issue 12).

Its rules inject a fault drawn from a part of the catalogue (held at least a
drawn time), heal one, send a burst of requests and wait, under the steady
closed-loop load of an ``ExampleHarness``; after every step the consistency
checkers judge the history so far. When one says False, Hypothesis shrinks
the program; every failing example's schedule is kept, and ``explore``
returns them with the smallest first.

What is explored is an ``ExplorePlan``: the suite explores a broad part of
the catalogue; the suite's own test (tests/test_explore_shrink.py) explores a
narrow one, so that a search and its shrinking fit in a CI run.

The budget bounds generation and shrinking: once it is spent, every rule does
nothing, so Hypothesis ends quickly, and the smallest failure seen so far is
reported (Hypothesis' own final replay then passes; that "flaky" verdict is
expected and ignored).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runs.explore import ExampleHarness, SavedSchedule, broken, crashed, make_clean, renumbered

#: (kind, replica index, params): one fault the machine may inject.
FaultDraw = tuple[str, int, dict[str, Any]]
MAX_ACTIVE = 2


def broad_faults() -> st.SearchStrategy[FaultDraw]:
    """The suite's catalogue subset: a whole replica paused or only its
    engine, latency on a router-replica link, a replica partitioned."""
    replica = st.integers(0, 1)
    return st.one_of(
        st.tuples(st.just("process_pause"), replica, st.just({})),
        st.tuples(st.just("process_pause"), replica, st.just({"only": "EngineCore"})),
        st.tuples(st.just("network_latency"), replica,
                  st.sampled_from([100, 300]).map(lambda ms: {"latency_ms": ms})),
        st.tuples(st.just("network_partition"), replica, st.just({"mode": "drop"})),
    )


@dataclass(frozen=True)
class ExplorePlan:
    """What the machine draws from. ``steps`` rules per example: a few are
    enough to inject, wait and heal."""

    faults: Callable[[], st.SearchStrategy[FaultDraw]] = broad_faults
    holds: Callable[[], st.SearchStrategy[int]] = lambda: st.integers(0, 8)
    waits: Callable[[], st.SearchStrategy[int]] = lambda: st.integers(1, 8)
    steps: int = 8


@dataclass
class Exploration:
    """What the machine needs from the caller, and what it found."""

    cluster: Any
    run_dir: Path
    say: Callable[[str], None]
    deadline: float
    plan: ExplorePlan = field(default_factory=ExplorePlan)
    examples: int = 0
    failures: list[SavedSchedule] = field(default_factory=list)
    # Examples that broke an invariant before injecting any fault: not a
    # finding of the schedule (the previous example's fault may still echo),
    # kept and reported, never shrunk as one.
    unattributed: list[dict[str, Any]] = field(default_factory=list)
    # Checkers that could not judge an example: a crash at any step, or a
    # final judgement (after the drain, with all the data) that is "unknown".
    unjudged: list[dict[str, Any]] = field(default_factory=list)

    def live(self) -> bool:
        return time.monotonic() < self.deadline


class InvariantBroken(AssertionError):
    """An exploration's finding."""


def found(bad: list[str], where: str) -> None:
    """Every finding is raised here, on this one line. Hypothesis shrinks a
    failure only towards examples that fail at the same place (its
    "interesting origin" is the exception's type and raising line), so a
    pause caught mid-program and the same pause caught only after the drain
    must not look like two different bugs: with two raise sites the shrinker
    stayed at 4 steps because the 2-step reproducer failed at the other one."""
    raise InvariantBroken(f"invariant(s) {bad} false {where}")


class ExploreMachine(RuleBasedStateMachine):
    """Rules draw from ``ctx.plan``; built per exploration by ``machine_for``
    because Hypothesis reads the rules' strategies from the class."""

    ctx: Exploration | None = None

    def __init__(self) -> None:
        super().__init__()
        self.h: ExampleHarness | None = None
        self.failed: list[str] = []
        ctx = type(self).ctx
        if ctx is None or not ctx.live():
            return  # budget spent: this example does nothing (and passes)
        ctx.examples += 1
        n = ctx.examples
        self.h = ExampleHarness(ctx.cluster, f"{ctx.run_dir.name}-x{n}",
                                ctx.run_dir / f"example-{n:03d}.jsonl", ctx.say)
        ctx.say(f"explore: example {n} ({ctx.deadline - time.monotonic():.0f}s of budget left)")
        self.h.start()

    def _live(self) -> bool:
        return self.h is not None and not self.h.closed and type(self).ctx.live()

    def _inject(self, choice: FaultDraw, hold_s: int) -> None:
        if not self._live():
            return
        kind, i, params = choice
        n = len(self.h.cluster.replicas())
        target = f"router-replica-{i % n}" if kind == "network_latency" else f"replica-{i % n}"
        if len(self.h.active) >= MAX_ACTIVE or any(s.target == target
                                                   for s, _ in self.h.active.values()):
            return  # one fault per target at a time: two pauses of one node would fight
        self.h.inject(kind, target, params, float(hold_s))

    @precondition(lambda self: self.h is not None and bool(self.h.active))
    @rule(which=st.integers(0, MAX_ACTIVE - 1))
    def heal(self, which: int) -> None:
        if not self._live():
            return
        keys = sorted(self.h.active)
        self.h.heal(keys[which % len(keys)])

    @rule(n=st.sampled_from([4, 8, 16]))
    def burst(self, n: int) -> None:
        if self._live():
            self.h.burst(n)

    def _wait(self, seconds: int) -> None:
        if self._live():
            self.h.wait(seconds)

    @invariant()
    def consistent_so_far(self) -> None:
        if self.h is None or self.h.closed:
            return
        results = self.h.check()
        self._unjudged(crashed(results))
        bad = broken(results)
        if bad and not self.h.steps:
            self._unattributed(bad)
            return
        if bad:
            self.failed = bad
            found(bad, f"after {self.h.program}")

    def _unjudged(self, what: list[str]) -> None:
        if what:
            type(self).ctx.unjudged.append({"example": self.h.history_path.name,
                                            "checkers": what})

    def _unattributed(self, bad: list[str]) -> None:
        ctx = type(self).ctx
        if not any(u["example"] == self.h.history_path.name for u in ctx.unattributed):
            ctx.unattributed.append({"example": self.h.history_path.name, "broke": bad,
                                     "program": list(self.h.program)})
            ctx.say(f"explore: {self.h.history_path.name} broke {bad} with no fault injected "
                    "yet: not a finding of a schedule (the previous example's effect may "
                    "still have been settling, or the stack fails under this load alone); "
                    "kept in the exploration's unattributed list")

    def teardown(self) -> None:
        if self.h is None:
            return
        ctx = type(self).ctx
        final: list[str] = []
        try:
            results = self.h.close()
            final = broken(results)
            self._unjudged([f"{r.name}: {r.details.get('error') or r.details.get('why') or r.details}"
                            for r in results if r.valid not in (True, False)
                            and not r.details.get("not_judgeable")])  # the cluster's limit
        finally:
            restarted = make_clean(ctx.cluster, ctx.say)
            if restarted:
                ctx.say(f"explore: restarted {restarted}")
        new = sorted(set(final) - set(self.failed))  # seen only after the last step
        self.failed = sorted(set(self.failed) | set(final))
        if self.failed and not self.h.steps:
            self._unattributed(self.failed)
            return
        if self.failed:
            saved = SavedSchedule(renumbered(self.h.schedule()), broke=self.failed,
                                  program=self.h.program,
                                  note=f"found by an Ordeal exploration, example "
                                       f"{self.h.history_path.name}")
            ctx.failures.append(saved)
            ctx.say(f"explore: example failed ({self.failed}) with {len(saved.steps)} "
                    f"step(s); {len(ctx.failures)} failing so far")
            if new:  # Hypothesis must see it to shrink it
                found(new, "after the drain")


def machine_for(ctx: Exploration) -> type[ExploreMachine]:
    """A machine class whose inject and wait rules draw from ``ctx.plan``."""
    plan = ctx.plan

    class Machine(ExploreMachine):
        @rule(choice=plan.faults(), hold_s=plan.holds())
        def inject(self, choice: FaultDraw, hold_s: int) -> None:
            self._inject(choice, hold_s)

        @rule(seconds=plan.waits())
        def wait(self, seconds: int) -> None:
            self._wait(seconds)

    Machine.ctx = ctx
    Machine.__name__ = Machine.__qualname__ = "ExploreMachine"
    return Machine


def judge_exploration(ctx: Exploration) -> list[str]:
    """What fails an exploration besides a shrunk finding: no example ran
    on the cluster (the budget bought nothing: a pass would be empty), an
    example broke an invariant before any fault (the stack is broken under
    this load alone), a checker could not judge an example. Empty: nothing."""
    problems = []
    if ctx.examples == 0:
        problems.append("no example ran on the cluster: nothing was explored (give a larger "
                        "--explore-budget; one example needs about 30 s here)")
    for u in ctx.unattributed:
        problems.append(f"{u['example']} broke {u['broke']} before any fault was injected "
                        f"(program {u['program']}): the stack fails under the load alone")
    for u in ctx.unjudged:
        problems.append(f"{u['example']}: could not judge {u['checkers']}")
    return problems


def smallest(failures: list[SavedSchedule]) -> SavedSchedule:
    """Fewest fault steps, then fewest rules, then least time: what a
    person reading the reproducer wants."""
    return min(failures, key=lambda f: (len(f.steps), len(f.program),
                                        max((s.at_s for s in f.steps), default=0.0)))


def explore(ctx: Exploration) -> BaseException | None:
    """Run the exploration until Hypothesis ends or the budget is spent,
    starting and ending on a clean cluster. Findings are in
    ``ctx.failures``; returns what Hypothesis raised (a finding, or a
    harness error when there is no finding), for the caller to judge."""
    budget_s = max(1.0, ctx.deadline - time.monotonic())
    machine_settings = settings(
        # An example takes 3-40 s; the budget, not this bound, ends the run
        # (past it every example is empty and takes a millisecond).
        max_examples=max(10, int(budget_s)), stateful_step_count=ctx.plan.steps,
        deadline=None, database=None, phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck), print_blob=False)
    try:
        make_clean(ctx.cluster, ctx.say)
        run_state_machine_as_test(machine_for(ctx), settings=machine_settings)
    except Exception as e:  # noqa: BLE001 - judged by the caller from ctx.failures
        return e
    finally:
        make_clean(ctx.cluster, ctx.say)
    return None
