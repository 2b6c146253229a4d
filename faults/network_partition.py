"""network_partition: cut nodes off, both ways, with iptables.

A node is cut at its endpoint: every TCP packet to its port and every packet
from its port is dropped (``mode="drop"``: packets vanish, a client's connect
or read times out, as behind a dead switch) or answered with a TCP reset
(``mode="reject"``: the peer learns at once, as behind a firewall that
rejects). Several nodes can be cut together (a minority, all replicas).

Today the nodes are loopback ports, so the rules match the port on the
node's loopback address, jumped to from INPUT and OUTPUT. A backend that
gives each node a network namespace will run the same chain there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Endpoint, Node

from .base import FaultError
from .iptables import ChainFault, ipv4_host
from .ledger import Ledger

Mode = Literal["drop", "reject"]
MODES: tuple[str, ...] = ("drop", "reject")


def partition_rules(endpoints: Sequence[Endpoint], mode: str) -> list[tuple[str, ...]]:
    """Rules (argv after ``-A <chain>``) that cut each endpoint both ways:
    packets to its port (requests in) and from its port (replies out)."""
    if mode not in MODES:
        raise FaultError(f"network_partition: mode {mode!r} is unknown; use 'drop' (packets "
                         "vanish, clients time out) or 'reject' (TCP reset, clients fail fast)")
    # A reset that REJECT sends runs through OUTPUT and INPUT itself, from or
    # to the cut port: matched again, it would be rejected (i.e. dropped) and
    # the client would time out instead of failing fast (seen). So in reject
    # mode resets pass; REJECT never answers a reset anyway.
    if mode == "drop":
        verdict: tuple[str, ...] = ("-j", "DROP")
    else:
        verdict = ("!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset")
    rules: list[tuple[str, ...]] = []
    for ep in endpoints:
        host = ipv4_host(ep, "network_partition")
        rules.append(("-p", "tcp", "-d", host, "--dport", str(ep.port), *verdict))
        rules.append(("-p", "tcp", "-s", host, "--sport", str(ep.port), *verdict))
    return rules


class NetworkPartition(ChainFault):
    kind = "network_partition"
    traits = KindTraits(kind, stops_target=True, hookable=True,
                        endurance=EnduranceChoice("one", {"mode": "drop"}, position=2))
    needs_root = True
    privilege = (
        'adds iptables rules (a chain ORDEAL-<id>, jumped to from INPUT and OUTPUT) in'
        " the node's network namespace: CAP_NET_ADMIN")
    without_root = (
        "connection_reset or http_fault on the node's link through the fault proxy (no "
        'root)')

    def __init__(self, target: Node | Sequence[Node], run_id: str, ledger: Ledger,
                 mode: Mode = "drop"):
        super().__init__(target, run_id, ledger)
        self.mode = mode

    def _rules(self) -> list[tuple[str, ...]]:
        return partition_rules([n.endpoint for n in self.nodes], self.mode)
