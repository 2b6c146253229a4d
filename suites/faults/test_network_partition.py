"""network_partition: one replica cut off (packets dropped both ways). The
router must route around it (failover: no new request to it after
``failover_bound_s``, and the requests after that bound meet [fault_slo];
each valid, or a finding the known-findings file lists for this stack), and
take it back after the heal."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_partitioned_replica_leaves_rotation_and_returns(ordeal_run):
    r = run_single_fault(ordeal_run, "network_partition", "replica-1", {"mode": "drop"})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    # The monitor, which talks to each replica directly, saw the cut ...
    assert fault.health["replica-1"]["None"] >= 1, r.brief()
    assert fault.health["replica-0"]["200"] >= 1, r.brief()
    # ... and after the heal the replica answers and serves traffic again.
    assert after.health["replica-1"]["200"] >= 1, r.brief()
    assert after.nodes["replica-1"] >= 1 and after.ok_share == 1.0, r.brief()
    judged = {i["name"]: i for i in r.summary["invariants"]}
    for name in ("failover", "fault_slo"):
        assert judged[name]["valid"] is True or judged[name].get("known"), judged[name]
    r.assert_verdict()  # the whole verdict, known findings applied
