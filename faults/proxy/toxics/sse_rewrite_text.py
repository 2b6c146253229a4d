"""sse_rewrite_text: replace the generated text of every data event after
the first ``after_events`` with ``text``, keeping the stream well formed
(same events, same ids, token ids and usage untouched): a wrong answer that
only a check of the content can catch, as greedy output diverging after a
KV-block corruption (vllm-project/vllm #39146) or a KV load that failed
and logged "recovered" (#49250) looks to a client. Used to plant a wrong
answer in a test of the verdict, never by a fault kind."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..sse import SseEvent
from .base import field_range
from .l7 import EveryNth, L7Toxic, ResponseContext


@dataclass(frozen=True)
class SseRewriteTextParams:
    after_events: int = field_range(0, 1 << 31, 0)
    text: str = "~"
    every_nth: int = field_range(1, 1 << 31, 1)  # one response in N (l7.EveryNth)


class SseRewriteText(EveryNth, L7Toxic):
    type = "sse_rewrite_text"
    Params = SseRewriteTextParams
    needs_sse = True

    def on_event(self, resp: ResponseContext, ev: SseEvent) -> list[SseEvent]:
        if ev.index is None or ev.index < self.params.after_events or ev.data is None \
                or not self.picked(resp):
            return [ev]
        try:
            body = json.loads(ev.data)
        except ValueError:
            return [ev]
        changed = False
        for choice in body.get("choices") or [] if isinstance(body, dict) else []:
            if isinstance(choice.get("text"), str) and choice["text"]:
                choice["text"], changed = self.params.text, True
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str) \
                    and delta["content"]:
                delta["content"], changed = self.params.text, True
        if not changed:
            return [ev]
        return [SseEvent.of_data(json.dumps(body, separators=(",", ":")), ev.index)]
