"""latency: delay every chunk by ``latency_ms`` plus a uniform jitter of
+-``jitter_ms``, counted from when the chunk was read (as Toxiproxy does), so
a stream keeps its throughput and only shifts in time. Removal releases
what is waiting at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .base import Emit, Toxic, ToxicError, field_range


@dataclass(frozen=True)
class LatencyParams:
    latency_ms: float = field_range(0, 3_600_000, 0.0)
    jitter_ms: float = field_range(0, 3_600_000, 0.0)


class Latency(Toxic):
    type = "latency"
    Params = LatencyParams

    @classmethod
    def validate(cls, params: LatencyParams) -> None:
        if params.jitter_ms > params.latency_ms:
            raise ToxicError("toxic 'latency': jitter_ms must not exceed latency_ms "
                             f"({params.jitter_ms} > {params.latency_ms})")

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        p = self.params
        delay = p.latency_ms
        if p.jitter_ms:
            delay += conn.rng(self).uniform(-p.jitter_ms, p.jitter_ms)
        wait = arrived + delay / 1000.0 - asyncio.get_running_loop().time()
        await self.hold(wait)
        await emit(data)
