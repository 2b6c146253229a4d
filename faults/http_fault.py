"""http_fault: L7 failures an HTTP client must survive, by the proxy's L7
toxics (always on the responses, i.e. downstream):

    mode="abort"        status (5xx), body: the request is answered by the
                        proxy and never reaches the server (http_abort)
    mode="delay_head"   delay_ms: the response head is late (http_delay_head)
    mode="error_event"  after_events: an error event mid-stream under HTTP
                        200, then [DONE] (sse_error_event)
    mode="truncate"     after_bytes: the body is cut and the connection
                        closed (truncate_body)
    mode="malformed"    after_events: one event's JSON is corrupted
                        (sse_corrupt_json)
"""

from __future__ import annotations

from typing import Any

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Link

from .base import FaultError
from .ledger import Ledger
from .link_fault import LinkFault, ToxicSpec

MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "abort": ("http_abort", {"status": 503}),
    "delay_head": ("http_delay_head", {"delay_ms": 1000}),
    "error_event": ("sse_error_event", {"after_events": 2}),
    "truncate": ("truncate_body", {"after_bytes": 256}),
    "malformed": ("sse_corrupt_json", {"after_events": 2}),
}


class HttpFault(LinkFault):
    kind = "http_fault"
    traits = KindTraits(kind, acts_on="l7_link", http1_only=True, endurance=EnduranceChoice(
        "router-replica-0", {"mode": "abort", "status": 503}, position=10))
    needs_root = False
    privilege = (
        "adds an L7 toxic through the fault proxy's control API on loopback; the proxy is"
        ' a process the suite started')

    def __init__(self, link: Link, run_id: str, ledger: Ledger, mode: str = "abort",
                 toxicity: float = 1.0, **attributes: Any):
        if mode not in MODES:
            raise FaultError(f"http_fault: unknown mode {mode!r}; use one of "
                             f"{', '.join(MODES)}")
        toxic_type, defaults = MODES[mode]
        self.mode = mode
        specs = [ToxicSpec(toxic_type, "downstream", {**defaults, **attributes}, toxicity)]
        super().__init__(link, run_id, ledger, specs)
