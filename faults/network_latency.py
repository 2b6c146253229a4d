"""network_latency: latency and jitter on a link, by the fault proxy's
``latency`` toxic (netem is not in every kernel; the proxy works anywhere).

``direction`` is where the delay applies: ``downstream`` (the default, as in
Toxiproxy: answers arrive late), ``upstream`` or ``both`` (twice the delay
per round trip)."""

from __future__ import annotations

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Link

from .ledger import Ledger
from .link_fault import LinkFault, ToxicSpec, directions


class NetworkLatency(LinkFault):
    kind = "network_latency"
    traits = KindTraits(kind, acts_on="l4_link", endurance=EnduranceChoice(
        "router-replica-0", {"latency_ms": 150, "jitter_ms": 50}, position=1))
    needs_root = False
    privilege = (
        "adds a latency toxic through the fault proxy's control API on loopback; the "
        'proxy is a process the suite started')

    def __init__(self, link: Link, run_id: str, ledger: Ledger, latency_ms: float = 100.0,
                 jitter_ms: float = 0.0, direction: str = "downstream", toxicity: float = 1.0):
        specs = [ToxicSpec("latency", d, {"latency_ms": latency_ms, "jitter_ms": jitter_ms},
                           toxicity) for d in directions(direction, self.kind)]
        super().__init__(link, run_id, ledger, specs)
