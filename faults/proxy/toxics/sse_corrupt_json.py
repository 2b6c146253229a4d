"""sse_corrupt_json: cut the JSON of the data event after the first
``after_events`` in half, so it no longer parses: a malformed event a
client must reject rather than skip silently."""

from __future__ import annotations

from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseCorruptJsonParams:
    after_events: int = field_range(0, 1 << 31, 0)


class SseCorruptJson(L7Toxic):
    type = "sse_corrupt_json"
    Params = SseCorruptJsonParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if ev.index != self.params.after_events or ev.data is None:
            return [ev]
        cut = ev.data[: max(1, len(ev.data) // 2)]
        return [SseEvent(b"data: " + cut.encode() + b"\n\n", cut, ev.index)]
