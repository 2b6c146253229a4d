"""packet_loss: drop a random fraction of a node's TCP packets (iptables
``statistic --mode random``). TCP retransmits, so at a moderate probability
requests still succeed, only slower; that is the effect a test observes.

On loopback every packet passes OUTPUT and then INPUT, so the chain is
jumped to from INPUT only: hooked twice, each packet would be drawn twice and
the loss would be 1-(1-p)^2 instead of p. The chain first counts every packet
of the port (rules without a target only count), then drops, so its counters
give the real loss rate: dropped / seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Endpoint, Node

from .base import FaultError
from .iptables import ChainFault, RuleCounter, chain_name, counters, ipv4_host
from .ledger import Ledger, LedgerEntry


def loss_rules(endpoints: Sequence[Endpoint], probability: float) -> list[tuple[str, ...]]:
    """Counting rules for every endpoint's packets, both ways, then random
    drops with ``probability`` (argv after ``-A <chain>``)."""
    if not 0.0 < probability <= 1.0:
        raise FaultError(f"packet_loss: probability {probability} must be in (0, 1]; "
                         "e.g. 0.1 drops one packet in ten")
    matches = []
    for ep in endpoints:
        host = ipv4_host(ep, "packet_loss")
        matches.append(("-p", "tcp", "-d", host, "--dport", str(ep.port)))
        matches.append(("-p", "tcp", "-s", host, "--sport", str(ep.port)))
    drop = ("-m", "statistic", "--mode", "random", "--probability", f"{probability:.6f}",
            "-j", "DROP")
    return [*matches, *(m + drop for m in matches)]


@dataclass(frozen=True)
class LossCounters:
    seen: int     # packets of the nodes' ports that reached the chain
    dropped: int  # of those, dropped at random

    @property
    def rate(self) -> float:
        return self.dropped / self.seen if self.seen else 0.0


def loss_counters(rules: Sequence[RuleCounter]) -> LossCounters:
    """Seen and dropped packets from the chain's counters (see loss_rules:
    the first half counts, the second half drops)."""
    half = len(rules) // 2
    if len(rules) % 2 or any(r.rule.endswith("-j DROP") for r in rules[:half]) \
            or not all(r.rule.endswith("-j DROP") for r in rules[half:]):
        raise ValueError(f"not a packet_loss chain: {[r.rule for r in rules]}")
    return LossCounters(sum(r.packets for r in rules[:half]),
                        sum(r.packets for r in rules[half:]))


def sum_loss(places: Sequence[LossCounters]) -> LossCounters:
    """Several places' counters (host, containers) as one."""
    return LossCounters(sum(c.seen for c in places), sum(c.dropped for c in places))


class PacketLoss(ChainFault):
    kind = "packet_loss"
    traits = KindTraits(kind, hookable=True,
                        endurance=EnduranceChoice("one", {"probability": 0.1}, position=3))
    needs_root = True
    privilege = (
        'adds iptables rules that drop packets at random (statistic --mode random) in '
        "the node's network namespace: CAP_NET_ADMIN")
    without_root = (
        "network_latency or bandwidth_limit on the node's link through the fault proxy "
        '(no root)')
    hooks = ("INPUT",)

    def __init__(self, target: Node | Sequence[Node], run_id: str, ledger: Ledger,
                 probability: float = 0.1):
        super().__init__(target, run_id, ledger)
        self.probability = probability

    def _rules(self) -> list[tuple[str, ...]]:
        return loss_rules([n.endpoint for n in self.nodes], self.probability)

    def loss(self) -> LossCounters:
        return sum_loss([loss_counters(rules) for rules in self.place_counters()])

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Read what the fault did (packets seen and dropped) just before the
        chain goes, so the history and summary carry the real loss rate."""
        try:
            places, _ = cls.entry_places(entry)
            c = sum_loss([loss_counters(counters(chain_name(entry.id), pid))
                          for pid in places.values()])
            measured: dict[str, Any] = {"packets_seen": c.seen, "packets_dropped": c.dropped,
                                        "loss_rate": round(c.rate, 4)}
        except Exception as e:  # noqa: BLE001 - the heal matters more than the figure
            measured = {"counters_error": f"{type(e).__name__}: {e}"}
        return {**measured, **super().undo(entry)}
