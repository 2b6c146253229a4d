"""packet_loss: 10% of one replica's packets dropped at random. Asserted:
the kernel's own counters saw the replica's packets dropped at that rate
while it was injected; after the heal its chain is gone, every request
succeeds and the replica serves again."""

import pytest

from faults import iptables
from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_packets_are_really_dropped_and_the_loss_stops_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "packet_loss", "replica-1", {"probability": 0.1})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    heal = r.window["heal_result"]
    assert heal["packets_seen"] >= 50, heal
    # Binomial: the measured rate is near 0.1 (5 standard deviations).
    n, p = heal["packets_seen"], 0.1
    assert abs(heal["loss_rate"] - p) <= 5 * (p * (1 - p) / n) ** 0.5, heal
    assert heal["existed"] is True  # the chain was there until the heal removed it
    # ... and is gone now, as the kernel's own listing shows: no loss is left.
    assert heal["chain"] not in [c.name for c in iptables.list_chains()], heal
    assert fault.requests >= 10 and after.ok_share == 1.0, r.brief()
    assert after.nodes["replica-1"] >= 1, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
