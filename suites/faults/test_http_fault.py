"""http_fault: the client-router link answers 503 to every response head
while injected; every such request is an unknown outcome (info), and all
succeed again after the heal. (The other modes, error events, truncation,
malformed SSE and a delayed head, are tested against a real replica in
tests/test_link_faults.py.)"""

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_aborts_with_503_are_seen_and_stop_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "http_fault", "client-router", {"mode": "abort",
                                                                     "status": 503})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    # A request in flight at the inject whose response had already begun is
    # left alone by the toxic (it bites response heads that arrive after it)
    # and still counts in the fault window, hence 90%, not all.
    assert fault.requests >= 10 and fault.statuses["503"] >= 0.9 * fault.requests, r.brief()
    assert fault.statuses["503"] + fault.types["ok"] == fault.requests, r.brief()
    assert after.requests >= 10 and after.ok_share == 1.0, r.brief()
    # A 5xx is an unknown outcome (info), never silently ok.
    assert fault.types["info"] == fault.statuses["503"], r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
