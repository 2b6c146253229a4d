"""process_pause: SIGSTOP one replica's whole process tree (a hang where the
port still accepts connections), SIGCONT on heal. The router must stop
sending to it (failover, with its ejection and re-admission times; fault_slo
after the bound), each valid or a finding the known-findings file lists."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_paused_replica_is_seen_hung_and_serves_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "process_pause", "replica-1")
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    assert fault.health["replica-1"]["None"] >= 1, r.brief()  # /health hangs
    assert after.health["replica-1"]["200"] >= 1, r.brief()
    assert after.nodes["replica-1"] >= 1, r.brief()
    assert after.ok_share == 1.0, r.brief()
    judged = {i["name"]: i for i in r.summary["invariants"]}
    [window] = judged["failover"]["details"]["windows_shown"].values()
    assert window["ejection_s"] is not None and "readmission_s" in window, window
    for name in ("failover", "fault_slo"):
        assert judged[name]["valid"] is True or judged[name].get("known"), judged[name]
    r.assert_verdict()  # the whole verdict, known findings applied
