"""bandwidth_limit: the client-router link squeezed to 2 KB/s downstream."""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_transfers_slow_down_while_injected_and_recover(ordeal_run):
    r = run_single_fault(ordeal_run, "bandwidth_limit", "client-router",
                         {"rate_kbps": 2, "direction": "downstream"})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    steady, fault, after = r.phases["steady"], r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    assert fault.requests >= 10 and after.requests >= 10, r.brief()
    # A streamed answer is several KB: at 2 KB/s it takes seconds.
    assert fault.p("e2e_ms") >= 3 * steady.p("e2e_ms"), r.brief()
    assert after.p("e2e_ms") <= 2 * steady.p("e2e_ms") + 200, r.brief()
    assert after.ok_share == 1.0, r.brief()
    assert fault.types["fail"] == 0, r.brief()  # slow is not broken: every answer whole
    r.assert_verdict()  # the whole verdict, known findings applied
