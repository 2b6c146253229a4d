"""The raw sockets of a proxied connection, non-blocking, driven by the
event loop, and the kernel relay (splice(2)) the fast path uses.

Why not asyncio streams: with no toxic on a link, the proxy moves bytes
from one socket to the other inside the kernel, through a pipe
(``splice``), so a large body passes at about the speed of a direct
connection (bench/bench_proxy.py; asyncio streams copied every byte twice
in user space and passed x0.23 of direct). splice needs the raw sockets
and no user-space buffer in front of them: a StreamReader may already hold
bytes that a splice would overtake. So the proxy owns its sockets: ``Side``
is one of them, with the few operations a connection needs (read, send,
peek, half-close, close or reset), each retried on readiness from the loop.

Two subtle parts. A socket's file descriptor number is reused by the next
connection as soon as it is closed, so ``close`` takes the socket off the
loop first and fails every waiter on it; nothing touches the loop's
registration of that number afterwards. And the loop keeps one reader and
one writer callback per descriptor, so all who wait for the same event on
a side share one one-shot future (two pumps can wait to write to one side:
http_abort's answer and the downstream relay).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct

#: The most one splice moves into the pipe at a time, and the pipe's size.
#: As root, 1 MiB (x1.05 of direct on 16 cores against x0.78 with 64 KiB,
#: bench/results/proxy-2026-12-03-16-cores); otherwise the kernel's default
#: 64 KiB, because a larger pipe counts against the per-user pipe limit
#: (fs.pipe-user-pages-soft, which root's CAP_SYS_RESOURCE escapes) and would
#: leave the user's other processes with one-page pipes.
PIPE_SIZE = (1 << 20) if os.geteuid() == 0 else (1 << 16)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
CAN_SPLICE = hasattr(os, "splice")
_SPLICE_FLAGS = (os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK) if CAN_SPLICE else 0
_AGAIN = (BlockingIOError, InterruptedError)


class SideClosed(ConnectionAbortedError):
    """The proxy closed this side itself (a toxic, a stop) while it waited."""


class Side:
    """One socket of a connection (the client's, or the upstream one)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # As asyncio's transports do: a small answer (an SSE event) goes out now.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.sending = 0  # sends in progress (what written_out waits for)
        # The one-shot future of each event (False: readable, True: writable).
        self._events: dict[bool, asyncio.Future[None] | None] = {False: None, True: None}

    async def wait_readable(self) -> None:
        await self._wait(False)

    async def wait_writable(self) -> None:
        await self._wait(True)

    async def _wait(self, writable: bool) -> None:
        if self.closed:
            raise SideClosed("closed by the proxy")
        fut = self._events[writable]
        if fut is None:
            fut = self._events[writable] = self.loop.create_future()
            add = self.loop.add_writer if writable else self.loop.add_reader
            add(self.fd, self._fire, writable)
        # shield: a waiter cancelled (its task ended) leaves the event to the others
        await asyncio.shield(fut)

    def _fire(self, writable: bool) -> None:
        """The event happened: off the loop (one-shot), and every waiter wakes."""
        (self.loop.remove_writer if writable else self.loop.remove_reader)(self.fd)
        fut, self._events[writable] = self._events[writable], None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def recv_nowait(self, n: int) -> bytes | None:
        """Up to ``n`` bytes, b"" at end of stream, None when nothing has
        arrived yet (then wait_readable and decide again: the caller may
        take the next bytes another way)."""
        if self.closed:
            raise SideClosed("closed by the proxy")
        try:
            return self.sock.recv(n)
        except _AGAIN:
            return None

    def peek(self, n: int) -> bytes:
        """Up to ``n`` bytes already received, left in place (b"" if none)."""
        try:
            return self.sock.recv(n, socket.MSG_PEEK)
        except (OSError, ValueError):
            return b""

    async def send(self, data: bytes) -> None:
        """All of ``data``, handed to the kernel (raises OSError when the
        peer is gone)."""
        view = memoryview(data)
        self.sending += 1
        try:
            while view:
                if self.closed:
                    raise SideClosed("closed by the proxy")
                try:
                    sent = self.sock.send(view)
                except _AGAIN:
                    await self.wait_writable()
                    continue
                view = view[sent:]
        finally:
            self.sending -= 1

    def shutdown_write(self) -> None:
        """Half-close: the peer reads end of stream (FIN), we can still read."""
        if not self.closed:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self, rst: bool = False) -> None:
        """Close now; with ``rst`` the peer gets a TCP RST (SO_LINGER on,
        zero timeout) instead of a FIN. Every waiter fails with SideClosed."""
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        for writable, fut in list(self._events.items()):
            self._events[writable] = None
            if fut is not None and not fut.done():
                fut.set_exception(SideClosed("closed by the proxy"))
                fut.exception()  # retrieved: no "never retrieved" log when none waited
        if rst:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.sock.close()


class KernelRelay:
    """splice(2) from one side to the other through a pipe of our own: the
    bytes never enter the process. Made when first used, closed with its
    connection."""

    def __init__(self) -> None:
        """OSError when no pipe can be made (out of descriptors)."""
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if PIPE_SIZE > 1 << 16:
            try:
                fcntl.fcntl(self.w, F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:  # over fs.pipe-max-size: the default pipe, splice moves less
                pass

    def take(self, src: Side) -> int | None:
        """Move what ``src`` has received into the pipe: the byte count, 0 at
        end of stream, None when nothing splice can move is there (nothing
        yet, or TCP urgent data: read it with recv). OSError as recv's."""
        if src.closed:
            raise SideClosed("closed by the proxy")
        try:
            return os.splice(src.fd, self.w, PIPE_SIZE, flags=_SPLICE_FLAGS)
        except _AGAIN:
            return None

    async def give(self, n: int, dst: Side) -> None:
        """Move the ``n`` bytes in the pipe out to ``dst``."""
        dst.sending += 1
        try:
            while n:
                if dst.closed:
                    raise SideClosed("closed by the proxy")
                try:
                    n -= os.splice(self.r, dst.fd, n, flags=_SPLICE_FLAGS)
                except _AGAIN:
                    await dst.wait_writable()
        finally:
            dst.sending -= 1

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


async def connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking socket to ``host:port``, trying each
    address the name resolves to (as asyncio.open_connection does)."""
    loop = asyncio.get_running_loop()
    try:  # an address needs no resolver (and no thread of the loop's pool)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
        except BaseException:
            sock.close()
            raise
    raise last or OSError(f"{host}:{port} resolves to no address")


def listen(host: str, port: int) -> socket.socket:
    """A listening non-blocking socket on the first address ``host`` names
    ("localhost" is 127.0.0.1: where glibc lists ::1 first, a proxy on ::1
    alone would refuse clients of 127.0.0.1)."""
    if host == "localhost":
        host = "127.0.0.1"
    family, type_, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
