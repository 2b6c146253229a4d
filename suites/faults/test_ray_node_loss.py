"""ray_node_loss (--cluster ray): SIGKILL a simulated Ray node that runs a
replica; Ray declares it dead and restarts the replica's actor on another
node, whose engine then serves on the same port. Skipped on other
backends, which have no Ray nodes."""

import pytest

from runs.single_fault import ray_node_with_replicas, run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_lost_node_s_replicas_are_rescheduled_and_serve_again(ordeal_run):
    target = ray_node_with_replicas(ordeal_run)
    r = run_single_fault(ordeal_run, "ray_node_loss", target, hold_s=2.0)
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    lost = r.window["inject_result"]["engines"]
    assert lost, f"no replica ran on {target}: nothing to reschedule"
    moved = r.window["heal_result"]["replicas"]
    assert sorted(moved) == sorted(lost), r.window
    # Recovery is measured from the kill to the first answer where Ray put it.
    assert all(m["moved"] and m["serving_after_inject_s"] > 0 for m in moved.values()), moved
    # While its engine was gone the monitor could not reach it; afterwards it
    # answers and takes traffic again.
    assert any(fault.health[name]["None"] >= 1 for name in lost), r.brief()
    assert all(after.health[name]["200"] >= 1 for name in lost), r.brief()
    assert after.ok_share == 1.0 and all(after.nodes[name] >= 1 for name in lost), r.brief()
    assert r.phases["steady"].ok_share == 1.0, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
