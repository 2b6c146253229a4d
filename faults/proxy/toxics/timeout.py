"""timeout: a blackhole. Data in this direction is held, never forwarded;
with ``timeout_ms`` > 0 the connection is closed that long after the first
held chunk (a peer that went silent, then a dropped connection), with 0 it
stays open and silent. Unlike Toxiproxy, held data is not dropped: removing
the toxic releases it in order, as TCP retransmission would after a healed
partition."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, field_range


@dataclass(frozen=True)
class TimeoutParams:
    timeout_ms: int = field_range(0, 86_400_000, 0)


class Timeout(Toxic):
    type = "timeout"
    Params = TimeoutParams

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        state = conn.state(self)
        if "deadline" not in state:
            ms = self.params.timeout_ms
            state["deadline"] = None if ms == 0 else conn.loop_time() + ms / 1000.0
        deadline = state["deadline"]
        wait = None if deadline is None else deadline - conn.loop_time()
        if await self.hold(wait if wait is None else max(wait, 0.0)):
            await emit(data)  # removed: release what was held
            return
        conn.close(f"timeout toxic {self.name!r}: closed after {self.params.timeout_ms} ms")
