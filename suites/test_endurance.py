"""Endurance and qualification (issue 7): load plus a seeded nemesis that
cycles through the fault catalogue for ``--duration``, judged as it goes.

    pytest suites/ -m endurance --duration 72h                  # a qualification
    pytest suites/ -m endurance --duration 30m --time-scale 10  # the same rhythm in 3 min
    pytest suites/ -m endurance --resume reports/runs/<run-id>  # after the harness died
    pytest suites/ -m endurance --baseline reports/runs/<previous release's run>

The schedule is printed at the start and kept in endurance.json; progress is
printed every ``--progress-every``; interim.json holds the invariants so far.
The test fails when an invariant is false, when the stop condition ended the
run, when a fault kind was never exercised, or when ``--baseline`` finds a
regression.
"""

from __future__ import annotations

import pytest

from fixtures.plugin import apply_options
from reports.baseline import apply_baseline
from reports.run_dir import RunDir
from runs.endurance import resume_history, run_endurance
from runs.endurance_plan import EnduranceState, load_state, save_state
from runs.run import OrdealRun

pytestmark = [pytest.mark.endurance, pytest.mark.cluster]


def test_endurance(request, ordeal_config, ordeal_cluster, ordeal_say):
    opts = ordeal_config.endurance
    if opts.resume is not None:
        run_dir = RunDir(opts.resume.resolve().parent, opts.resume.resolve().name)
        state = load_state(run_dir.path)
        history, position_s, first_index = resume_history(run_dir, ordeal_say)
    else:
        ordeal_config.runs_dir.mkdir(parents=True, exist_ok=True)
        run_dir = RunDir.create(ordeal_config.runs_dir, "endurance")
        state = EnduranceState(opts.plan, opts.plan.schedule())
        save_state(run_dir.path, state)
        history, position_s, first_index = None, 0.0, 0
    run = OrdealRun(run_dir, "endurance", ordeal_cluster, ordeal_say, history=history)
    apply_options(run, request, ordeal_config)
    error = None
    try:
        judge = run_endurance(run, state, ordeal_say, position_s, first_index)
    except BaseException as e:
        error = f"the endurance run broke: {type(e).__name__}: {e}"
        raise
    finally:
        summary = run.finish(error)
        if opts.baseline is not None:
            summary = apply_baseline(summary, opts.baseline, opts.baseline_thresholds)
            run.run_dir.write_summary(summary)
            ordeal_say(f"endurance: qualification against {opts.baseline}: "
                       f"{summary['qualification']}")
    section = summary["endurance"]
    assert not section["stopped"], section["stopped"]
    assert not section["kinds_missing"], (f"fault kind(s) never injected: "
                                          f"{section['kinds_missing']}; see {run_dir.path}")
    false = [i for i in summary["invariants"] if i["valid"] is not True]
    assert summary["verdict"] == "pass", (summary["errors"], false)
    if opts.baseline is not None:
        assert summary["qualification"] == "pass", summary["baseline"]
    assert judge.stop_reason is None
