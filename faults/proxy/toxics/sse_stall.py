"""sse_stall: after ``after_events`` data events of a stream, hold the rest
of it for ``stall_ms`` (then let it go on, or at once when the toxic is
removed), on one response in ``every_nth``. The first tokens come, then
nothing, while the server and its ``/health`` are fine: decode stalled
after prefill, as when one rank of a tensor-parallel group hangs in NCCL.
Used by the failure zoo (faults/zoo/decode_stall.py), never by a fault
kind."""

from __future__ import annotations

from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import EveryNth, L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseStallParams:
    after_events: int = field_range(1, 1 << 31, 1)
    stall_ms: float = field_range(0, 3_600_000, 60_000.0)
    every_nth: int = field_range(1, 1 << 31, 1)  # one response in N (l7.EveryNth)


class SseStall(EveryNth, L7Toxic):
    type = "sse_stall"
    Params = SseStallParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if ev.index == self.params.after_events - 1 and self.picked(resp):
            resp.stall = (self, self.params.stall_ms / 1000.0)
            self.counters["stalls"] = self.counters.get("stalls", 0) + 1
        return [ev]

    def hits(self) -> int:
        """Streams it stalled (it changes no event)."""
        return self.counters.get("stalls", 0)
