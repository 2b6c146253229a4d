"""bandwidth: limit a direction to ``rate_kbps`` kilobytes (1000 bytes) per
second, Toxiproxy's unit for its ``rate``. Large chunks go out in pieces of
about 100 ms worth so the flow is smooth, not bursty. Removal sends the rest
of the current chunk at once."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, field_range


@dataclass(frozen=True)
class BandwidthParams:
    rate_kbps: float = field_range(0.001, 10_000_000, 1000.0)


class Bandwidth(Toxic):
    type = "bandwidth"
    Params = BandwidthParams

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        rate = self.params.rate_kbps * 1000.0  # bytes per second
        piece = max(1, int(rate / 10))  # ~100 ms of traffic
        view = memoryview(data)
        for start in range(0, len(data), piece):
            chunk = bytes(view[start:start + piece])
            if await self.hold(len(chunk) / rate):
                await emit(bytes(view[start:]))
                return
            await emit(chunk)
