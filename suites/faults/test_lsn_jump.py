"""lsn_jump: events of token streams in flight are dropped on the way to the
client; the stream checker must catch it, and only while injected."""

import pytest

from fixtures.fault_suite import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_dropped_stream_events_are_caught_and_stop_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "lsn_jump", "client-router",
                         {"mode": "duplicate", "after_events": 2})
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    by_name = {i["name"]: i for i in r.summary["invariants"]}
    wf = by_name["stream_wellformed"]
    assert wf["valid"] is False, wf  # the checker caught the jump ...
    assert fault.types["fail"] >= 1 or wf["counterexamples"], r.brief()
    fault_start = r.window["injected"]
    assert all(c["wall"] >= fault_start[:19] for c in wf["counterexamples"]), wf
    assert after.requests >= 10 and after.ok_share == 1.0, r.brief()  # ... and it healed
