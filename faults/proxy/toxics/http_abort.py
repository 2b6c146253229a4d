"""http_abort: answer the next request on the connection with ``status``
and ``body`` instead of forwarding it (the upstream never sees it), then
close the connection (``Connection: close``). A router's 503, an overloaded
gateway. The request is read to its end first, so the client gets the
answer and not a reset."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .base import field_range
from .l7 import L7Toxic

REASONS = {400: "Bad Request", 408: "Request Timeout", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


@dataclass(frozen=True)
class HttpAbortParams:
    status: int = field_range(100, 599, 503)
    body: str = field(default="")


class HttpAbort(L7Toxic):
    type = "http_abort"
    Params = HttpAbortParams

    def response_bytes(self) -> bytes:
        p = self.params
        body = (p.body or json.dumps({"error": {
            "object": "error", "type": "ordeal_fault", "code": p.status,
            "message": f"ordeal http_abort toxic {self.name!r}: injected HTTP {p.status}"}})
        ).encode()
        reason = REASONS.get(p.status, "Injected")
        head = (f"HTTP/1.1 {p.status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n"
                f"x-ordeal-toxic: {self.name}\r\n\r\n")
        return head.encode("latin-1") + body
