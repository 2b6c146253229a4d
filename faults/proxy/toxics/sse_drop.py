"""sse_drop (an lsn_jump): drop ``count`` data events after the first
``after_events``: a gap in the token stream the client must notice."""

from __future__ import annotations

from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import L7Toxic, ResponseContext, in_window


@dataclass(frozen=True)
class SseWindowParams:
    after_events: int = field_range(0, 1 << 31, 0)
    count: int = field_range(1, 1 << 31, 1)


class SseDrop(L7Toxic):
    type = "sse_drop"
    Params = SseWindowParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        p = self.params
        return [] if in_window(ev, p.after_events, p.count) else [ev]
