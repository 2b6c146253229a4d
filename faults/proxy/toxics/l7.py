"""The L7 toxic base: hooks the response stage (``..l7_stage``) calls for
each HTTP response it rewrites. Every hook sees a per-response state dict,
so a keep-alive connection's next response starts clean. L7 toxics act on
responses, so their direction is always ``downstream``."""

from __future__ import annotations

from typing import Any, ClassVar

from ..sse import SseEvent
from .base import Toxic


class ResponseContext:
    """One response being rewritten: the toxics picked at its head, and a
    state dict per toxic."""

    def __init__(self, toxics: list["L7Toxic"]):
        self.toxics = toxics
        self._state: dict[int, dict[str, Any]] = {}
        self.finish_early = False  # a toxic ended the stream; drop the rest
        self.request_target = b""  # the path of the request this answers (as far as seen)
        # A toxic that stalls the stream after an event sets (toxic, seconds):
        # the stage sends what came before, holds, then goes on (sse_stall).
        self.stall: tuple["Toxic", float] | None = None

    def state(self, toxic: Toxic) -> dict[str, Any]:
        return self._state.setdefault(toxic.uid, {})


class L7Toxic(Toxic):
    layer = "l7"
    needs_sse: ClassVar[bool] = False  # rewrites SSE events (text/event-stream bodies)

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        # What it did, for GET /links and a link fault's heal result: response
        # heads it was applied to, SSE bodies among them it rewrote, and data
        # events it dropped, repeated, held or replaced.
        self.counters = {"responses": 0, "sse_responses": 0, "events_changed": 0}

    def hits(self) -> int:
        """An SSE toxic acted when it changed an event; any other L7 toxic
        when it was applied to a response."""
        return self.counters["events_changed" if self.needs_sse else "responses"]

    async def before_head(self, resp: ResponseContext) -> None:
        """Called before the response head is forwarded."""

    def body_limit(self) -> int | None:
        """Body bytes after which the response is cut (None: no cut)."""
        return None

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        """What to send instead of ``ev`` (SSE responses, when needs_sse)."""
        return [ev]

    def flush(self, resp: ResponseContext) -> list[SseEvent]:
        """Events still held at the end of the stream or at removal."""
        return []


def in_window(ev: SseEvent, after: int, count: int) -> bool:
    return ev.index is not None and after <= ev.index < after + count


class EveryNth:
    """For an L7 toxic whose Params have ``every_nth``: it acts on one
    response in N it sees (1: every one), counted per toxic. ``toxicity``
    picks connections, as in Toxiproxy; a client or router that keeps a few
    pooled connections then gets all or nothing, so a share of *responses*
    is asked this way (the failure zoo plants shapes so)."""

    def picked(self, resp: ResponseContext) -> bool:
        if self.params.every_nth == 1:  # type: ignore[attr-defined]
            return True
        state = resp.state(self)  # type: ignore[arg-type]
        if "picked" not in state:
            seen = self.__dict__.get("_responses_seen", 0)
            self.__dict__["_responses_seen"] = seen + 1
            state["picked"] = seen % self.params.every_nth == 0  # type: ignore[attr-defined]
        return state["picked"]

