"""sse_rewrite_usage: add ``delta`` to ``usage.completion_tokens`` (and to
``total_tokens``) of every event that carries a usage object, leaving the
streamed tokens as they are: the count a client bills by disagrees with
what it received. Used by the failure zoo (faults/zoo/usage_mismatch.py),
never by a fault kind."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import EveryNth, L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseRewriteUsageParams:
    delta: int = field_range(-(1 << 20), 1 << 20, 1)
    every_nth: int = field_range(1, 1 << 31, 1)  # one response in N (l7.EveryNth)


class SseRewriteUsage(EveryNth, L7Toxic):
    type = "sse_rewrite_usage"
    Params = SseRewriteUsageParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if ev.done or ev.data is None or '"usage"' not in ev.data or not self.picked(resp):
            return [ev]
        try:
            body = json.loads(ev.data)
        except ValueError:
            return [ev]
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
            return [ev]
        usage["completion_tokens"] += self.params.delta
        if isinstance(usage.get("total_tokens"), int):
            usage["total_tokens"] += self.params.delta
        return [SseEvent.of_data(json.dumps(body, separators=(",", ":")), ev.index)]
