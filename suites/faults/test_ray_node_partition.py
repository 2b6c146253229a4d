"""ray_node_partition (--cluster ray, root): cut a simulated Ray node that
runs a replica off from the head. Ray declares it dead and restarts the
replica's actor elsewhere, while the old engine, whose serving port is not
cut, still answers through the router; heal ends that orphan and the moved
actor's engine takes over (an outage of its own while it loads: on this
machine both share the replica's port). Skipped on other backends."""

import pytest

from runs.single_fault import ray_node_with_replicas, run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_partitioned_node_is_declared_dead_yet_its_engines_serve_then_heal(ordeal_run):
    target = ray_node_with_replicas(ordeal_run)
    r = run_single_fault(ordeal_run, "ray_node_partition", target, hold_s=12.0)
    steady, hold, after = r.phases["steady"], r.phases["hold"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    cut = r.window["inject_result"]["engines"]
    assert cut, f"no replica ran on {target}: nothing to observe"
    heal = r.window["heal_result"]
    # Ray's control plane lost the node (its replicas were moved) ...
    assert heal["dropped_packets"] > 0 and sorted(heal["orphans_ended"]) == sorted(cut), heal
    # ... while the data plane kept serving: until the heal began, the
    # partition was no outage. (The heal is one here: the moved actors'
    # engines need the port the orphans hold, so they start only after.)
    assert hold.requests >= 10 and hold.ok_share >= 0.9, r.brief()
    assert all(hold.nodes[name] >= 1 for name in cut), r.brief()
    assert after.ok_share == 1.0 and all(after.nodes[name] >= 1 for name in cut), r.brief()
    assert steady.ok_share == 1.0, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
