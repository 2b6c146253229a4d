"""connection_reset: reset (TCP RST) the link's connections, ``timeout_ms``
after their first bytes in ``direction`` (0: at the first bytes), or once
``after_bytes`` bytes have passed, by the proxy's ``reset_peer`` toxic. With
a timeout longer than time to first token, or a byte count past the response
head, streams are cut mid-way: what a crashed middlebox does. The byte
trigger lands inside a response whatever the engine's speed. (Where the
suite runs as root, iptables REJECT --reject-with tcp-reset does the same in
the kernel; this is the form that works without root.)"""

from __future__ import annotations

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Link

from .ledger import Ledger
from .link_fault import LinkFault, ToxicSpec, directions


class ConnectionReset(LinkFault):
    kind = "connection_reset"
    traits = KindTraits(kind, acts_on="l4_link", endurance=EnduranceChoice(
        "router-replica-0", {"timeout_ms": 0}, position=6))
    needs_root = False
    privilege = (
        "adds a reset toxic through the fault proxy's control API on loopback; the proxy "
        'is a process the suite started')

    def __init__(self, link: Link, run_id: str, ledger: Ledger, timeout_ms: int = 0,
                 direction: str = "downstream", toxicity: float = 1.0, after_bytes: int = 0):
        attributes = {"timeout_ms": timeout_ms, "after_bytes": after_bytes}
        specs = [ToxicSpec("reset_peer", d, attributes, toxicity)
                 for d in directions(direction, self.kind)]
        super().__init__(link, run_id, ledger, specs)
