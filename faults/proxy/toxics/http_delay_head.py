"""http_delay_head: hold each response's head for ``delay_ms`` (a slow
prefill, a stalled gateway): time to first byte and TTFT grow, the body is
untouched."""

from __future__ import annotations

from dataclasses import dataclass

from .base import field_range
from .l7 import L7Toxic, ResponseContext


@dataclass(frozen=True)
class HttpDelayHeadParams:
    delay_ms: float = field_range(0, 3_600_000, 0.0)


class HttpDelayHead(L7Toxic):
    type = "http_delay_head"
    Params = HttpDelayHeadParams

    async def before_head(self, resp: ResponseContext) -> None:
        await self.hold(self.params.delay_ms / 1000.0)
