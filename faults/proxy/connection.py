"""One proxied TCP connection: two pumps (upstream: client to server,
downstream: server to client), each a reader and a writer joined by a queue.

When no toxic applies and nothing is queued, the reader moves what
arrived to the other side inside the kernel (the fast path: splice(2)
through a pipe, ``sockets.KernelRelay``; the bytes never enter the process,
so a link with no toxic passes a large body at about direct speed).
Otherwise it reads the chunk, stamps it with the time it was read and
queues it, and the writer runs it through the toxics in order, so a
latency toxic delays chunks without serialising the stream, and a toxic
that holds data (timeout, latency) holds the queue behind it, keeping order.
A toxic added while bytes are in the pipe acts from the next read on.

HTTP awareness is minimal and cheap: a request starts with the first
upstream bytes after downstream bytes (or the first on the connection),
a response with the first downstream bytes after a request. That is how
http_abort finds "the next request" and the response stage (l7_stage) is
attached at a response boundary. It assumes no pipelining (no HTTP/1.1
client in use pipelines).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
from typing import TYPE_CHECKING, Any

from .l7_stage import ResponseStage
from .sockets import CAN_SPLICE, KernelRelay, Side
from .toxics.base import Emit, Toxic
from .toxics.http_abort import HttpAbort
from .toxics.l7 import L7Toxic

if TYPE_CHECKING:  # pragma: no cover
    from .link import ProxyLink

log = logging.getLogger("ordeal.proxy")
READ_SIZE = 256 * 1024
PEEK = 96  # bytes that hold a request line's method and the start of its path (http_hold)
QUEUE_DEPTH = 64  # chunks; past this the reader waits (backpressure to the sender)
ABORT_DRAIN_S = 5.0


class Connection:
    def __init__(self, link: "ProxyLink", conn_id: int, seed: int,
                 client: Side, upstream: Side):
        self.link = link
        self.id = conn_id
        self.seed = seed
        self.client = client
        self.up = upstream
        self.closed = False
        self.close_reason = ""
        self.aborted_exchange = False
        self.awaiting_response = False  # a request went up; the next downstream bytes start a response
        self.awaiting_request = True  # a response came down; the next upstream bytes start a request
        self.last_method = b"GET"
        self.last_target = b""  # the request line's target (path), for L7 toxics that spare some
        self.stage: ResponseStage | None = None
        self._enabled: dict[int, bool] = {}
        self._rngs: dict[int, random.Random] = {}
        self._state: dict[int, dict[str, Any]] = {}
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.closed_event = asyncio.Event()
        self.client_eof = asyncio.Event()  # the client finished sending (used by http_abort)

    # -- helpers the toxics use ----------------------------------------------

    def enabled(self, toxic: Toxic) -> bool:
        """Toxicity: decided once per connection and toxic, seeded, so a run
        with the same seed and the same connection order repeats."""
        key = toxic.uid
        if key not in self._enabled:
            if toxic.toxicity >= 1.0:
                self._enabled[key] = True
            else:
                r = random.Random(f"{self.seed}/{self.link.name}/{self.id}/{toxic.name}")
                self._enabled[key] = r.random() < toxic.toxicity
        return self._enabled[key]

    def rng(self, toxic: Toxic) -> random.Random:
        key = toxic.uid
        if key not in self._rngs:
            self._rngs[key] = random.Random(
                f"{self.seed}/{self.link.name}/{self.id}/{toxic.name}/rng")
        return self._rngs[key]

    def state(self, toxic: Toxic) -> dict[str, Any]:
        return self._state.setdefault(toxic.uid, {})

    def loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, fn: Any) -> asyncio.TimerHandle:
        handle = asyncio.get_running_loop().call_later(delay, fn)
        self._timers.append(handle)
        return handle

    def l4_toxics(self, direction: str) -> list[Toxic]:
        return [t for t in self.link.l4[direction] if self.enabled(t)]

    def l7_toxics(self) -> list[L7Toxic]:
        return [t for t in self.link.l7 if self.enabled(t) and not isinstance(t, HttpAbort)]

    async def written_out(self, direction: str, within_s: float = 1.0) -> None:
        """Wait (at most ``within_s``) until the writer of ``direction`` has
        handed everything it is sending to the kernel."""
        side = self.up if direction == "upstream" else self.client
        deadline = self.loop_time() + within_s
        while not self.closed and side.sending > 0 and self.loop_time() < deadline:
            await asyncio.sleep(0.005)

    # -- ending the connection -------------------------------------------------

    def close(self, reason: str) -> None:
        """Graceful close (FIN) of both sides, now."""
        self._end(reason, rst=False)

    def reset(self, reason: str) -> None:
        """TCP RST to both sides: SO_LINGER on with a zero timeout, then close."""
        self._end(reason, rst=True)

    def _end(self, reason: str, rst: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.closed_event.set()
        self.close_reason = reason
        level = logging.DEBUG if reason == "both sides closed" else logging.INFO
        log.log(level, "link %s conn %d: %s", self.link.name, self.id, reason)
        for side in (self.client, self.up):
            side.close(rst=rst)
        for t in self._timers:
            t.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    # -- running -----------------------------------------------------------------

    async def run(self) -> None:
        up = Pump(self, "upstream", self.client, self.up)
        down = Pump(self, "downstream", self.up, self.client)
        self._tasks = [asyncio.create_task(p.read_loop()) for p in (up, down)] + \
                      [asyncio.create_task(p.write_loop()) for p in (up, down)]
        try:
            await asyncio.gather(*self._tasks[:2], return_exceptions=True)
            # Both directions read to EOF; let the writers drain their queues
            # (unless a toxic closed the connection meanwhile).
            await asyncio.gather(up.drained(), down.drained(), return_exceptions=True)
        finally:
            self.close(self.close_reason or "both sides closed")
            await asyncio.gather(*self._tasks, return_exceptions=True)
            up.close_relay()
            down.close_relay()

    async def abort_exchange(self, toxic: HttpAbort) -> None:
        """http_abort: answer the client ourselves, never forward the
        request, read the client's request to its end (so closing does not
        reset it), then close."""
        self.aborted_exchange = True
        toxic.counters["responses"] += 1
        log.info("link %s conn %d: http_abort %s answers %d", self.link.name, self.id,
                 toxic.name, toxic.params.status)
        self.up.close()
        try:
            await self.client.send(toxic.response_bytes())
            self.client.shutdown_write()
            # The upstream pump's reader discards the rest of the request and
            # sets client_eof when the client closes after our answer.
            try:
                await asyncio.wait_for(self.client_eof.wait(), ABORT_DRAIN_S)
            except asyncio.TimeoutError:
                pass
        except (ConnectionError, OSError):
            pass
        self.close(f"http_abort {toxic.name}: answered {toxic.params.status}")


class Pump:
    """One direction of a connection."""

    def __init__(self, conn: Connection, direction: str, src: Side, dst: Side):
        self.conn = conn
        self.link = conn.link
        self.direction = direction
        self.src = src
        self.dst = dst
        self.queue: asyncio.Queue[tuple[bytes, float, bool]] = asyncio.Queue(QUEUE_DEPTH)
        self.pending = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.eof_sent = False
        self.relay: KernelRelay | None = None
        self.splice_ok = CAN_SPLICE
        self.woke = False  # the last relay waited for the source to be readable
        self.read_once = False  # read the next bytes with recv (splice stops at urgent data)

    async def drained(self) -> None:
        """Wait until the queue is written out, or the connection closed."""
        waits = [asyncio.ensure_future(self.idle.wait()),
                 asyncio.ensure_future(self.conn.closed_event.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _fast(self) -> bool:
        """Nothing queued, no toxic on this direction, no response stage:
        the bytes can go straight through."""
        conn = self.conn
        return (self.pending == 0 and not self.link.has_toxics(self.direction)
                and (self.direction == "upstream" or conn.stage is None)
                and not conn.aborted_exchange)

    def _note(self, size: int, head: bytes) -> bool:
        """Count ``size`` bytes read and follow the request/response
        boundaries; True when these bytes start a request (upstream) or a
        response (downstream). ``head``: their first bytes (the method)."""
        conn = self.conn
        if self.direction == "upstream":
            self.link.bytes_up += size
            starts = conn.awaiting_request
            if starts:
                conn.awaiting_request = False
                parts = head.split(b" ", 2)
                conn.last_method = parts[0][:16]
                conn.last_target = parts[1][:512] if len(parts) > 1 else b""
            conn.awaiting_response = True
        else:
            self.link.bytes_down += size
            starts = conn.awaiting_response
            conn.awaiting_response = False
            conn.awaiting_request = True
        return starts

    async def read_loop(self) -> None:
        conn = self.conn
        up = self.direction == "upstream"
        loop = asyncio.get_running_loop()
        while not conn.closed:
            try:
                if self.splice_ok and not self.read_once and self._fast():
                    if not await self._relay():
                        return  # end of stream, passed on
                    continue
                data = self.src.recv_nowait(READ_SIZE)
                if data is None:  # nothing yet: wait, then decide the path again
                    await self.src.wait_readable()
                    continue
                self.read_once = False
            except (ConnectionError, OSError) as e:
                if conn.aborted_exchange:
                    if up:
                        conn.client_eof.set()
                elif not conn.closed:
                    conn.reset(f"{self.direction} read failed ({type(e).__name__}); "
                               "passing the reset on")
                return
            if conn.aborted_exchange:
                if not up:
                    return
                if not data:  # http_abort answered; the client is done sending
                    conn.client_eof.set()
                    return
                continue  # the rest of an aborted request: never forwarded
            if conn.closed:
                return
            starts = self._note(len(data), data[:PEEK]) if data else False
            if self._fast():
                await self._write_direct(data)
            else:
                self.pending += 1
                self.idle.clear()
                await self.queue.put((data, loop.time(), starts))
            if not data:
                return

    async def _relay(self) -> bool:
        """The fast path, once: what the source has received goes to the
        destination inside the kernel. False at end of stream (passed on as
        a half-close). Read errors raise, as ``recv``'s do."""
        if self.relay is None:
            try:
                self.relay = KernelRelay()
            except OSError as e:  # out of descriptors: read and write instead
                log.warning("link %s: no pipe for splice (%s); this connection reads and "
                            "writes", self.link.name, e)
                self.splice_ok = False
                return True
        conn = self.conn
        head = (self.src.peek(PEEK) if self.direction == "upstream" and conn.awaiting_request
                else b"")
        try:
            n = self.relay.take(self.src)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            self.splice_ok = False  # a socket splice cannot read: read and write instead
            return True
        if n is None:
            if self.woke:  # readable, yet nothing splice can move: urgent data
                self.read_once = True
            else:  # nothing yet: wait, then decide the path again
                await self.src.wait_readable()
            self.woke = not self.read_once
            return True
        self.woke = False
        if n == 0:
            self._eof()
            return False
        self._note(n, head)
        self.link.bytes_spliced += n
        try:
            await self.relay.give(n, self.dst)
        except (ConnectionError, OSError) as e:
            conn.close(f"{self.direction} write failed ({type(e).__name__})")
        return True

    def close_relay(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None

    async def _write_direct(self, data: bytes) -> None:
        if data:
            await self.write(data)
        else:
            self._eof()

    def _eof(self) -> None:
        if self.eof_sent or self.conn.closed:
            return
        self.eof_sent = True
        self.dst.shutdown_write()

    async def write(self, data: bytes) -> None:
        if self.conn.closed or not data:
            return
        try:
            await self.dst.send(data)
        except (ConnectionError, OSError) as e:
            self.conn.close(f"{self.direction} write failed ({type(e).__name__})")

    async def write_loop(self) -> None:
        while True:
            data, arrived, starts = await self.queue.get()
            try:
                if not self.conn.closed and not self.conn.aborted_exchange:
                    await self._process(data, arrived, starts)
            finally:
                self.pending -= 1
                if self.pending == 0:
                    self.idle.set()

    async def _process(self, data: bytes, arrived: float, starts: bool) -> None:
        conn = self.conn
        toxics = conn.l4_toxics(self.direction)

        async def l4(piece: bytes) -> None:
            await self._chain(toxics, 0, piece, arrived)

        if self.direction == "upstream":
            if starts and data:
                for t in self.link.l7:
                    if isinstance(t, HttpAbort) and conn.enabled(t) and not t.removed.is_set():
                        await conn.abort_exchange(t)
                        return
            await self._pass(data, l4)
            return
        if conn.stage is not None and starts and data and conn.stage.lost:
            conn.stage.resync()
        if conn.stage is None and starts and data and conn.l7_toxics():
            conn.stage = ResponseStage(conn)
        if conn.stage is not None:
            if data:
                await conn.stage.feed(data, l4)
            else:
                await conn.stage.feed_eof(l4)
            if conn.stage is not None and conn.stage.detachable:
                conn.stage = None
            if data:
                return
        await self._pass(data, l4)

    async def _pass(self, data: bytes, l4: Emit) -> None:
        if data:
            await l4(data)
        else:
            self._eof()

    async def _chain(self, toxics: list[Toxic], i: int, data: bytes, arrived: float) -> None:
        if self.conn.closed:
            return
        if i == len(toxics):
            await self.write(data)
            return
        toxic = toxics[i]

        async def nxt(piece: bytes) -> None:
            await self._chain(toxics, i + 1, piece, arrived)

        if toxic.removed.is_set():
            await nxt(data)
        else:
            toxic.counters["chunks"] += 1
            await toxic.pipe(self.conn, data, arrived, nxt)
