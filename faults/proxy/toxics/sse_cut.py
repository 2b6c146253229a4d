"""sse_cut: end a stream early and cleanly after ``after_events`` data
events. The HTTP response ends well framed (chunked terminator, connection
reusable), so the client sees no transport error:

- ``fabricate=false``: the stream simply stops, with no ``finish_reason``
  and no ``[DONE]`` (what a client sees when a server or proxy closes the
  stream of an aborted generation);
- ``fabricate=true``: a proxy "completes" the cut stream itself: one more
  chunk with ``finish_reason: "stop"`` and empty text, then ``[DONE]``. A
  truncation that looks complete; no usage chunk follows (a proxy that
  invents the end does not know the count).

Used by the failure zoo (faults/zoo/) to plant these shapes inside the
serving path, never by a fault kind."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import EveryNth, L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseCutParams:
    after_events: int = field_range(0, 1 << 31, 2)
    fabricate: bool = False
    every_nth: int = field_range(1, 1 << 31, 1)  # one response in N (l7.EveryNth)


def fabricated_stop(ev: SseEvent) -> SseEvent | None:
    """The event ``ev`` turned into a final chunk: every choice's text (or
    delta content) emptied, ``finish_reason`` "stop", no usage."""
    try:
        body = json.loads(ev.data or "")
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return None
    for choice in body["choices"]:
        if not isinstance(choice, dict):
            continue
        if "text" in choice:
            choice["text"] = ""
        if isinstance(choice.get("delta"), dict):
            choice["delta"] = {}
        choice.pop("token_ids", None)
        choice["finish_reason"] = "stop"
    body["usage"] = None
    return SseEvent.of_data(json.dumps(body, separators=(",", ":")), ev.index)


class SseCut(EveryNth, L7Toxic):
    type = "sse_cut"
    Params = SseCutParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if resp.finish_early:
            return []
        if ev.done or ev.index is None or ev.index < self.params.after_events \
                or not self.picked(resp):
            return [ev]
        resp.finish_early = True
        if not self.params.fabricate:
            return []
        last = fabricated_stop(ev)
        return [last, SseEvent.of_data("[DONE]")] if last is not None else []
