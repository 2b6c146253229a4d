"""network_latency: 400 ms on the client-router link, responses direction."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_latency_is_seen_while_injected_and_gone_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "network_latency", "client-router",
                         {"latency_ms": 400, "direction": "downstream"})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    steady, fault, after = r.phases["steady"], r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    assert fault.requests >= 10 and after.requests >= 10, r.brief()
    assert fault.p("ttft_ms") >= steady.p("ttft_ms") + 300, r.brief()
    assert after.p("ttft_ms") <= steady.p("ttft_ms") + 150, r.brief()
    assert fault.ok_share == after.ok_share == 1.0, r.brief()  # slow, not broken
    r.assert_verdict()  # the whole verdict, known findings applied
