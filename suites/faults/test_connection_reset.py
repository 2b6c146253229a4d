"""connection_reset: every connection on the client-router link is reset."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_resets_are_seen_by_clients_and_stop_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "connection_reset", "client-router", {"timeout_ms": 0})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    steady, fault, after = r.phases["steady"], r.phases["fault"], r.phases["after_heal"]
    hold = r.phases["hold"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    # A request in flight at the inject may have had its answer pass before
    # the toxic was in place: only those sent once it was are judged here.
    assert hold.requests >= 10, r.brief()
    assert hold.types["ok"] == 0, r.brief()
    assert any("reset" in e.lower() or "connection" in e.lower() for e in fault.errors), r.brief()
    assert after.requests >= 10 and after.ok_share == 1.0, r.brief()
    # Requests invoked just before the inject may be reset in flight.
    assert steady.ok_share >= 0.9, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
