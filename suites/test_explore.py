"""Explore fault schedules on the real cluster and shrink a failure (issue 12).

The Hypothesis state machine of runs/explore_machine.py: its rules
inject a fault (held at least a drawn 0-8 s) drawn from a small part of the
catalogue (process_pause of a whole replica or of its engine only,
network_latency on a router-replica link, network_partition of one replica),
heal one, send a burst of requests and wait, under a steady closed-loop
load; after every step the consistency checkers judge the history so far.
When one says False, Hypothesis shrinks the program; every failing
example's schedule is kept, and the smallest is written to
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
from pathlib import Path
from typing import Any

import pytest

from ordeal.config import ConfigError, parse_duration
from runs.explore import broken, load_schedule, replay, save_schedule
from runs.explore_machine import Exploration, explore, judge_exploration, smallest

pytestmark = [pytest.mark.explore, pytest.mark.cluster]


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
    outcome = explore(ctx)
    ordeal_say(f"explore: {ctx.examples} example(s) on the cluster, {len(ctx.failures)} "
               f"failing, budget {budget_s:.0f}s")
    ordeal_run.summary_extra["explore_unattributed"] = ctx.unattributed
    ordeal_run.summary_extra["explore_unjudged"] = ctx.unjudged
    if ctx.unattributed:
        ordeal_say(f"explore: {len(ctx.unattributed)} example(s) broke an invariant before any "
                   f"fault (summary explore_unattributed): {ctx.unattributed}")
    # Broken before any fault, nothing explored, a checker that could not
    # judge: each fails the exploration, as a shrunk finding does.
    problems = judge_exploration(ctx)
    if not ctx.failures:
        if outcome is not None:
            raise outcome  # a harness error, not a finding
        if problems:
            pytest.fail("explore: " + "; ".join(problems), pytrace=False)
        return
    minimal = smallest(ctx.failures)
    path = save_schedule(run_dir / "minimal-schedule.json", minimal)
    text = json.dumps(minimal.to_dict()["steps"], indent=1)
    ordeal_say(f"explore: minimal failing schedule ({minimal.broke}) in {path}:\n{text}")
    request.node.user_properties.append(("explore.minimal_schedule", str(path)))
    pytest.fail(f"invariant(s) {minimal.broke} false; minimal schedule of "
                f"{len(minimal.steps)} step(s) saved to {path}; replay it with "
                f"--replay {path}" + "".join(f"; {p}" for p in problems), pytrace=False)


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
    # Could not judge (a crash, no data) is not a pass; only what the
    # cluster cannot give (an external deployment's not_judgeable) is.
    unjudged = [r.to_dict() for r in results if r.valid not in (True, False)
                and not r.details.get("not_judgeable")]
    assert not unjudged, unjudged
