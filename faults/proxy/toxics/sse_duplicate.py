"""sse_duplicate (an lsn_jump): send each of ``count`` data events after the
first ``after_events`` twice: a repeated token (a retried write, a replayed
log entry)."""

from __future__ import annotations

from ..sse import SseEvent
from .l7 import L7Toxic, ResponseContext, in_window
from .sse_drop import SseWindowParams


class SseDuplicate(L7Toxic):
    type = "sse_duplicate"
    Params = SseWindowParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        p = self.params
        return [ev, ev] if in_window(ev, p.after_events, p.count) else [ev]
