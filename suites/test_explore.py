"""Explore fault schedules on the real cluster and shrink a failure (issue 12).

A Hypothesis RuleBasedStateMachine: its rules inject a fault (held at least
a drawn 0-8 s) drawn from a small part of the catalogue (process_pause of a whole replica or of its
engine only, network_latency on a router-replica link, network_partition of
one replica), heal one, send a burst of requests and wait, under a steady
closed-loop load; after every step the consistency checkers judge the
history so far. When one says False, Hypothesis shrinks the program; every
failing example's schedule is kept, and the smallest is written to
``minimal-schedule.json`` in the run directory and printed. ``--replay FILE``
runs such a file again (same steps, times, workload and seed).

    pytest suites/test_explore.py -m explore --explore-budget 5m
    pytest suites/test_explore.py -m explore --replay docs/examples/engine-pause-health-lie.json

The budget bounds generation and shrinking: once it is spent, every rule
does nothing, so Hypothesis ends quickly, and the smallest failure seen so
far is reported (its own final replay would then pass; that "flaky" verdict
is expected and ignored).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from fixtures.explore import (ExampleHarness, SavedSchedule, broken, load_schedule,
                              make_clean, replay, save_schedule, renumbered)
from ordeal.config import ConfigError, parse_duration

pytestmark = [pytest.mark.explore, pytest.mark.cluster]

STEPS = 8  # rules per example: a few are enough to pause, wait and heal
MAX_ACTIVE = 2


def fault_choices() -> st.SearchStrategy[tuple[str, int, dict[str, Any]]]:
    """(kind, replica index, params): the catalogue subset explored."""
    replica = st.integers(0, 1)
    return st.one_of(
        st.tuples(st.just("process_pause"), replica, st.just({})),
        st.tuples(st.just("process_pause"), replica, st.just({"only": "EngineCore"})),
        st.tuples(st.just("network_latency"), replica,
                  st.sampled_from([100, 300]).map(lambda ms: {"latency_ms": ms})),
        st.tuples(st.just("network_partition"), replica, st.just({"mode": "drop"})),
    )


@dataclass
class Exploration:
    """What the machine needs from the test, and what it found."""

    cluster: Any
    run_dir: Path
    say: Any
    deadline: float
    examples: int = 0
    failures: list[SavedSchedule] = field(default_factory=list)

    def live(self) -> bool:
        return time.monotonic() < self.deadline


class ExploreMachine(RuleBasedStateMachine):
    ctx: Exploration | None = None  # set by the test before a run

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

    @rule(choice=fault_choices(), hold_s=st.integers(0, 8))
    def inject(self, choice: tuple[str, int, dict[str, Any]], hold_s: int) -> None:
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

    @rule(seconds=st.integers(1, 8))
    def wait(self, seconds: int) -> None:
        if self._live():
            self.h.wait(seconds)

    @invariant()
    def consistent_so_far(self) -> None:
        if self.h is None or self.h.closed:
            return
        bad = broken(self.h.check())
        if bad:
            self.failed = bad
            raise AssertionError(f"invariant(s) {bad} false after {self.h.program}")

    def teardown(self) -> None:
        if self.h is None:
            return
        ctx = type(self).ctx
        final: list[str] = []
        try:
            final = broken(self.h.close())
        finally:
            restarted = make_clean(ctx.cluster, ctx.say)
            if restarted:
                ctx.say(f"explore: restarted {restarted}")
        new = sorted(set(final) - set(self.failed))  # seen only after the last step
        self.failed = sorted(set(self.failed) | set(final))
        if self.failed:
            saved = SavedSchedule(renumbered(self.h.schedule()), broke=self.failed,
                                  program=self.h.program,
                                  note=f"found by suites/test_explore.py, example "
                                       f"{self.h.history_path.name}")
            ctx.failures.append(saved)
            ctx.say(f"explore: example failed ({self.failed}) with {len(saved.steps)} "
                    f"step(s); {len(ctx.failures)} failing so far")
            if new:  # Hypothesis must see it to shrink it
                raise AssertionError(f"invariant(s) {new} false after the drain")


def smallest(failures: list[SavedSchedule]) -> SavedSchedule:
    """Fewest fault steps, then fewest rules, then least time: what a
    person reading the reproducer wants."""
    return min(failures, key=lambda f: (len(f.steps), len(f.program),
                                        max((s.at_s for s in f.steps), default=0.0)))


def option(config: pytest.Config, name: str, default: Any) -> Any:
    """The plugin's option, or ``default`` where the plugin does not define
    it yet (getoption's default applies only to unknown options)."""
    return config.getoption(name, default=default)


def test_explore_fault_schedules(request, ordeal_cluster, ordeal_run, ordeal_say):
    if option(request.config, "--replay", None):
        pytest.skip("--replay given: the replay test runs instead")
    try:
        budget_s = parse_duration(option(request.config, "--explore-budget", "5m"),
                                  "--explore-budget")
    except ConfigError as e:
        raise pytest.UsageError(str(e)) from None
    run_dir = ordeal_run.run_dir.path
    ctx = Exploration(ordeal_cluster, run_dir, ordeal_say, time.monotonic() + budget_s)
    ExploreMachine.ctx = ctx
    machine_settings = settings(
        # An example here takes 3-40 s; the budget, not this bound, ends the
        # run (past it every example is empty and takes a millisecond).
        max_examples=max(10, int(budget_s)), stateful_step_count=STEPS,
        deadline=None, database=None, phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck), print_blob=False)
    outcome: BaseException | None = None
    try:
        make_clean(ordeal_cluster, ordeal_say)
        run_state_machine_as_test(ExploreMachine, settings=machine_settings)
    except Exception as e:  # noqa: BLE001 - the verdict comes from ctx.failures below
        outcome = e
    finally:
        ExploreMachine.ctx = None
        make_clean(ordeal_cluster, ordeal_say)
    ordeal_say(f"explore: {ctx.examples} example(s) on the cluster, {len(ctx.failures)} "
               f"failing, budget {budget_s:.0f}s")
    if not ctx.failures:
        if outcome is not None:
            raise outcome  # a harness error, not a finding
        return
    minimal = smallest(ctx.failures)
    path = save_schedule(run_dir / "minimal-schedule.json", minimal)
    text = json.dumps(minimal.to_dict()["steps"], indent=1)
    ordeal_say(f"explore: minimal failing schedule ({minimal.broke}) in {path}:\n{text}")
    request.node.user_properties.append(("explore.minimal_schedule", str(path)))
    pytest.fail(f"invariant(s) {minimal.broke} false; minimal schedule of "
                f"{len(minimal.steps)} step(s) saved to {path}; replay it with "
                f"--replay {path}", pytrace=False)


def test_replay_schedule(request, ordeal_run, ordeal_say):
    """``--replay FILE``: the saved schedule again, deterministically; fails
    when an invariant is false, as the run that found it did."""
    path = option(request.config, "--replay", None)
    if not path:
        pytest.skip("no --replay FILE given")
    saved = load_schedule(Path(path))
    ordeal_say(f"replay: {len(saved.steps)} step(s) from {path} (it broke {saved.broke})")
    results = replay(ordeal_run, saved)
    bad = broken(results)
    ordeal_say(f"replay: false now: {bad or 'none'}")
    assert not bad, [r.to_dict() for r in results if r.valid is False]
