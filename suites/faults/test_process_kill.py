"""process_kill: SIGKILL one replica's tree and restart it (the smoke suite
does this under a longer load; this is the short, per-fault form)."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_killed_replica_is_gone_then_restarted_and_serving(ordeal_run):
    r = run_single_fault(ordeal_run, "process_kill", "replica-1", hold_s=2.0)
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    assert r.window["inject_result"]["signal"] == "SIGKILL"
    assert r.window["heal_result"]["restarted"] is True, r.window
    # While it was down (the window lasts until it serves again) the monitor
    # could not reach it; after the heal it answers and takes traffic.
    assert fault.health["replica-1"]["None"] >= 1, r.brief()
    assert after.health["replica-1"]["200"] >= 1, r.brief()
    assert after.nodes["replica-1"] >= 1 and after.ok_share == 1.0, r.brief()
    # Requests cut by the kill count in the fault window, not as steady errors.
    assert r.phases["steady"].ok_share == 1.0, r.brief()
