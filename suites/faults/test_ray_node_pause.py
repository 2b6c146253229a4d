"""ray_node_pause (--cluster ray): SIGSTOP a simulated Ray node that runs a
replica, longer than Ray's dead-node verdict (~3 s here). Its engines stop
answering; Ray moves the replicas; heal continues the node, ends the
orphaned engines and every replica serves again. Skipped on other
backends."""

import pytest

from runs.single_fault import ray_node_with_replicas, run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_paused_node_s_replicas_stall_then_move_and_serve(ordeal_run):
    target = ray_node_with_replicas(ordeal_run)
    r = run_single_fault(ordeal_run, "ray_node_pause", target, hold_s=8.0)
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    paused = r.window["inject_result"]["engines"]
    assert paused, f"no replica ran on {target}: nothing to pause"
    heal = r.window["heal_result"]
    assert sorted(heal["orphans_ended"]) == sorted(paused), heal
    # A stopped engine answers nothing: probes time out while it is paused.
    assert any(fault.health[name]["None"] >= 1 for name in paused), r.brief()
    assert after.ok_share == 1.0 and all(after.nodes[name] >= 1 for name in paused), r.brief()
    assert r.phases["steady"].ok_share == 1.0, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
