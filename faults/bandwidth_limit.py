"""bandwidth_limit: throttle a link to ``rate_kbps`` kilobytes per second
(the proxy's ``bandwidth`` toxic), and optionally slice writes into small
delayed pieces (its ``slicer``), as a congested or lossy path does."""

from __future__ import annotations

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Link

from .ledger import Ledger
from .link_fault import LinkFault, ToxicSpec, directions


class BandwidthLimit(LinkFault):
    kind = "bandwidth_limit"
    traits = KindTraits(kind, acts_on="l4_link", endurance=EnduranceChoice(
        "router-replica-0", {"rate_kbps": 64, "direction": "downstream"}, position=4))
    needs_root = False
    privilege = (
        "adds a bandwidth toxic through the fault proxy's control API on loopback; the "
        'proxy is a process the suite started')

    def __init__(self, link: Link, run_id: str, ledger: Ledger, rate_kbps: float = 100.0,
                 direction: str = "downstream", slice_average_size: int | None = None,
                 slice_size_variation: int = 0, slice_delay_us: int = 0,
                 toxicity: float = 1.0):
        specs = []
        for d in directions(direction, self.kind):
            specs.append(ToxicSpec("bandwidth", d, {"rate_kbps": rate_kbps}, toxicity))
            if slice_average_size is not None:
                specs.append(ToxicSpec("slicer", d, {"average_size": slice_average_size,
                                                     "size_variation": slice_size_variation,
                                                     "delay_us": slice_delay_us}, toxicity))
        super().__init__(link, run_id, ledger, specs)
