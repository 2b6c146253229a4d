"""http_hold: hold the head of every response for ``hold_ms`` except those
answering a request whose path starts with ``spare_prefix`` (default
``/health``): a backend hung for real work whose health check still
answers, so a router keeps it in rotation and every request sent to it
waits out its timeout. Released at once when the toxic is removed. Used by
the failure zoo (faults/zoo/hung_backend_in_rotation.py), never by a fault
kind."""

from __future__ import annotations

from dataclasses import dataclass

from .base import field_range
from .l7 import L7Toxic, ResponseContext


@dataclass(frozen=True)
class HttpHoldParams:
    hold_ms: float = field_range(0, 3_600_000, 60_000.0)
    spare_prefix: str = "/health"


class HttpHold(L7Toxic):
    type = "http_hold"
    Params = HttpHoldParams

    def spared(self, resp: ResponseContext) -> bool:
        prefix = self.params.spare_prefix.encode()
        return bool(prefix) and resp.request_target.startswith(prefix)

    async def before_head(self, resp: ResponseContext) -> None:
        if self.spared(resp):
            return
        resp.state(self)["held"] = True
        await self.hold(self.params.hold_ms / 1000.0)
