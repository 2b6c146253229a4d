"""reset_peer: reset the connection (TCP RST, via SO_LINGER 0). Both sides see
"connection reset by peer", as when a middlebox or a crashed host drops the
connection mid-stream.

Two triggers:

- ``after_bytes`` > 0: after that many bytes have passed in this direction
  (counted from when the toxic first sees the connection); the bytes before
  the cut are written out first. A cut placed by what has flowed lands inside
  a response whatever the engine's speed, so tests use this one.
- otherwise ``timeout_ms`` after the first chunk this toxic sees (Toxiproxy's
  attribute); with 0, at once, before that chunk is forwarded.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, ToxicError, field_range


@dataclass(frozen=True)
class ResetPeerParams:
    timeout_ms: int = field_range(0, 86_400_000, 0)
    after_bytes: int = field_range(0, 1 << 62, 0)


class ResetPeer(Toxic):
    type = "reset_peer"
    Params = ResetPeerParams

    @classmethod
    def validate(cls, params: ResetPeerParams) -> None:
        if params.after_bytes and params.timeout_ms:
            raise ToxicError("toxic 'reset_peer': give either 'after_bytes' (cut after that "
                             "many bytes) or 'timeout_ms' (cut after that time), not both")

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.counters["resets"] = 0

    def hits(self) -> int:
        """Connections it reset (a chunk let through before the cut is no
        effect)."""
        return self.counters["resets"]

    def _reset(self, conn, why: str) -> None:
        self.counters["resets"] += 1
        conn.reset(why)

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        if self.params.after_bytes:
            await self._after_bytes(conn, data, emit)
            return
        ms = self.params.timeout_ms
        if ms == 0:
            self._reset(conn, f"reset_peer toxic {self.name!r}")
            return
        state = conn.state(self)
        if "timer" not in state:
            def fire() -> None:
                if not self.removed.is_set():
                    self._reset(conn, f"reset_peer toxic {self.name!r} after {ms} ms")
            state["timer"] = conn.call_later(ms / 1000.0, fire)
        await emit(data)

    async def _after_bytes(self, conn, data: bytes, emit: Emit) -> None:
        state = conn.state(self)
        limit = self.params.after_bytes
        passed = state.get("passed", 0)
        if passed + len(data) < limit:
            state["passed"] = passed + len(data)
            await emit(data)
            return
        await emit(data[:limit - passed])
        state["passed"] = limit
        # An RST discards what the socket still holds: let the bytes before
        # the cut leave first, so the peer sees exactly a cut stream.
        await conn.written_out(self.direction)
        self._reset(conn, f"reset_peer toxic {self.name!r} after {limit} bytes")
