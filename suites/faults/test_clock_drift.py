"""clock_drift: one replica's wall clock jumps an hour ahead (libfaketime),
then back. vLLM stamps every response with its wall clock ("created"), so
the history shows the jump and the return."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_replica_clock_moves_while_injected_and_returns_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "clock_drift", "replica-1",
                         {"mode": "offset", "offset_s": 3600})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    steady, fault, after = r.phases["steady"], r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    assert abs(steady.median_skew("replica-1")) <= 3, r.brief()
    assert abs(fault.median_skew("replica-1") - 3600) <= 3, r.brief()
    assert abs(fault.median_skew("replica-0")) <= 3, r.brief()  # only the target moved
    assert abs(after.median_skew("replica-1")) <= 3, r.brief()
    # A wrong wall clock must not break serving: vLLM times on monotonic clocks.
    assert fault.ok_share == after.ok_share == 1.0, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
