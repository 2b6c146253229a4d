"""reset_peer: reset the connection (TCP RST, via SO_LINGER 0) ``timeout_ms``
after the first chunk this toxic sees on it; with 0, at once, before that
chunk is forwarded. Both sides see "connection reset by peer", as when a
middlebox or a crashed host drops the connection mid-stream."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Emit, Toxic, field_range


@dataclass(frozen=True)
class ResetPeerParams:
    timeout_ms: int = field_range(0, 86_400_000, 0)


class ResetPeer(Toxic):
    type = "reset_peer"
    Params = ResetPeerParams

    async def pipe(self, conn, data: bytes, arrived: float, emit: Emit) -> None:
        ms = self.params.timeout_ms
        if ms == 0:
            conn.reset(f"reset_peer toxic {self.name!r}")
            return
        state = conn.state(self)
        if "timer" not in state:
            def fire() -> None:
                if not self.removed.is_set():
                    conn.reset(f"reset_peer toxic {self.name!r} after {ms} ms")
            state["timer"] = conn.call_later(ms / 1000.0, fire)
        await emit(data)
