"""sse_error_event: after ``after_events`` data events, send an error event
(``data: {"error": {...}}``, the shape vLLM itself sends when a stream fails
under HTTP 200), then ``[DONE]``, and end the stream; the rest of the
upstream's response is read and discarded so the connection stays usable."""

from __future__ import annotations

from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseErrorEventParams:
    after_events: int = field_range(0, 1 << 31, 0)
    code: int = field_range(100, 599, 500)


class SseErrorEvent(L7Toxic):
    type = "sse_error_event"
    Params = SseErrorEventParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if ev.done or (ev.index is not None and ev.index >= self.params.after_events):
            resp.finish_early = True
            msg = (f"ordeal sse_error_event toxic {self.name!r}: injected error after "
                   f"{self.params.after_events} event(s)")
            return [SseEvent.error(msg, self.params.code), SseEvent.of_data("[DONE]")]
        return [ev]
