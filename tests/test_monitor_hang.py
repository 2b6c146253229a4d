"""A /metrics endpoint that trickles (issue 11): the monitor's sample ends
within its deadline with the reason recorded, instead of waiting for the
whole body for as long as the server likes.

The real thing: a replica's /metrics read through the fault proxy with the
link throttled to 1 KB/s (real vLLM, real proxy, real bandwidth toxic). The
body is tens of KB, so a read that waited for all of it would take tens of
seconds; each piece arrives well inside urllib's per-read timeout, which is
why a plain ``read()`` never timed out.
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from faults.factory import build_faults
from faults.ledger import Ledger
from load.monitor import sample_node


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_trickling_metrics_endpoint_is_cut_at_the_deadline(ordeal_cluster):
    link = ordeal_cluster.link("router-replica-0")
    via_proxy = SimpleNamespace(name="replica-0", endpoint=link.listen, pid=None)
    t = time.monotonic()
    fast = sample_node(via_proxy, timeout=2.0)
    fast_s = time.monotonic() - t  # this machine's own time for a whole sample
    assert fast.get("metrics") and "error" not in fast, fast  # control: whole, in its deadline

    [fault] = build_faults("bandwidth_limit", "router-replica-0", ordeal_cluster, "monitor-hang",
                           Ledger(), random.Random(0), {"rate_kbps": 1.0})
    with fault:
        t = time.monotonic()
        slow = sample_node(via_proxy, timeout=2.0)
        took = time.monotonic() - t
    assert "metrics" not in slow, slow
    assert "/metrics: TimeoutError: body not complete after 4s" in slow["error"], slow
    # Derived from the deadlines, not this machine's speed: the health
    # request's 2 s timeout + the 4 s metrics deadline + one 2 s read = 8 s,
    # with half again and the control's own time for a loaded machine; a
    # monitor that waited out the trickle (KBs at 1 KB/s) would take far longer.
    assert took < (2.0 + 4.0 + 2.0) * 1.5 + fast_s, (took, fast_s)

    healed = sample_node(via_proxy, timeout=2.0)
    assert healed.get("metrics") and "error" not in healed, healed
