"""truncate_body: forward ``after_bytes`` bytes of a response body, then
close the connection: the client sees a body cut short (a chunked stream
without its last chunk, or fewer bytes than Content-Length)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import field_range
from .l7 import L7Toxic


@dataclass(frozen=True)
class TruncateBodyParams:
    after_bytes: int = field_range(0, 1 << 62, 0)


class TruncateBody(L7Toxic):
    type = "truncate_body"
    Params = TruncateBodyParams

    def body_limit(self) -> int | None:
        return self.params.after_bytes
