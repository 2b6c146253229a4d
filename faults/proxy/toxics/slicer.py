"""slicer: cut each chunk into pieces of ``average_size`` +- ``size_variation``
bytes with ``delay_us`` between them, as Toxiproxy's slicer does: the bytes
are unchanged, only their segmentation and pacing change (what a slow or
fragmenting network does to a client's parser). Removal sends the rest at
once."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, ToxicError, field_range


@dataclass(frozen=True)
class SlicerParams:
    average_size: int = field_range(1, 1 << 24, 64)
    size_variation: int = field_range(0, 1 << 24, 0)
    delay_us: int = field_range(0, 60_000_000, 0)


class Slicer(Toxic):
    type = "slicer"
    Params = SlicerParams

    @classmethod
    def validate(cls, params: SlicerParams) -> None:
        if params.size_variation >= params.average_size:
            raise ToxicError("toxic 'slicer': size_variation must be smaller than average_size "
                             f"({params.size_variation} >= {params.average_size})")

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        p = self.params
        rng = conn.rng(self)
        pos = 0
        while pos < len(data):
            size = p.average_size + rng.randint(-p.size_variation, p.size_variation)
            await emit(data[pos:pos + size])
            pos += size
            if pos < len(data) and await self.hold(p.delay_us / 1e6):
                await emit(data[pos:])
                return
