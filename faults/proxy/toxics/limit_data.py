"""limit_data: forward ``bytes`` bytes in this direction (counted from when
the toxic first sees the connection), then close the connection: a peer
that hangs up after a partial transfer."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, field_range


@dataclass(frozen=True)
class LimitDataParams:
    bytes: int = field_range(0, 1 << 62, 0)


class LimitData(Toxic):
    type = "limit_data"
    Params = LimitDataParams

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        state = conn.state(self)
        left = self.params.bytes - state.get("sent", 0)
        if len(data) < left:
            state["sent"] = state.get("sent", 0) + len(data)
            await emit(data)
            return
        if left > 0:
            await emit(data[:left])
        state["sent"] = self.params.bytes
        conn.close(f"limit_data toxic {self.name!r}: {self.params.bytes} bytes sent")
