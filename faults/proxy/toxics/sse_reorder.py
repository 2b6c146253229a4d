"""sse_reorder (an lsn_jump): hold ``count`` (>= 2) data events after the
first ``after_events`` and send them in reverse order (count 2 swaps two
neighbours). If the stream ends, or the toxic is removed, before ``count``
are held, the held ones go out reversed at that point: nothing is lost."""

from __future__ import annotations

from dataclasses import dataclass

from ..sse import SseEvent
from .base import ToxicError, field_range
from .l7 import L7Toxic, ResponseContext, in_window


@dataclass(frozen=True)
class SseReorderParams:
    after_events: int = field_range(0, 1 << 31, 0)
    count: int = field_range(2, 1 << 16, 2)


class SseReorder(L7Toxic):
    type = "sse_reorder"
    Params = SseReorderParams
    needs_sse = True

    @classmethod
    def validate(cls, params: SseReorderParams) -> None:
        if params.count < 2:
            raise ToxicError("toxic 'sse_reorder': count must be at least 2")

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        p = self.params
        held: list[SseEvent] = resp.state(self).setdefault("held", [])
        if in_window(ev, p.after_events, p.count):
            held.append(ev)
            return self.flush(resp) if len(held) == p.count else []
        return self.flush(resp) + [ev]

    def flush(self, resp: ResponseContext) -> list[SseEvent]:
        held: list[SseEvent] = resp.state(self).setdefault("held", [])
        out = held[::-1]
        held.clear()
        return out
