"""An incremental HTTP/1.1 *response* framing parser, pure (no sockets).

It finds where each response's head and body begin and end (chunked,
Content-Length, until-close, or no body for 1xx/204/304/HEAD), so that L7
toxics can act on one response of a keep-alive connection and leave the
next one intact. Every byte fed comes back out in some event's ``raw``,
so a response nobody rewrites is forwarded byte for byte. Anything it does
not understand becomes ``Opaque`` and is passed through untouched, until
``resync`` (the connection's next exchange) starts over at a response head;
after a ``101 Switching Protocols`` every byte is ``Opaque`` for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096


@dataclass
class Head:
    raw: bytes
    status: int
    headers: list[tuple[str, str]]
    framing: str  # "chunked" | "length" | "close" | "none" | "info" (1xx, another head follows)

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


@dataclass
class Body:
    data: bytes  # body bytes (de-chunked)
    raw: bytes  # the bytes as framed on the wire


@dataclass
class End:
    raw: bytes  # the last chunk and trailers (chunked), else b""


@dataclass
class Opaque:
    raw: bytes


Event = Union[Head, Body, End, Opaque]


class ResponseParser:
    def __init__(self, method_of_request: Callable[[], bytes] = lambda: b"GET"):
        self.method_of_request = method_of_request
        self.buf = b""
        self.state = "head"
        self.remaining = 0
        self.last_line = b""

    @property
    def idle(self) -> bool:
        """Between responses with nothing buffered."""
        return self.state == "head" and not self.buf

    @property
    def lost(self) -> bool:
        """Gave up on the framing (``Opaque``), not after a protocol switch."""
        return self.state == "opaque"

    def resync(self) -> None:
        """Expect a response head again (called where a new exchange
        starts), so that one stretch of bytes it could not frame does not
        blind it for the rest of a keep-alive connection."""
        if self.state == "opaque":
            self.state, self.buf, self.remaining = "head", b"", 0

    def feed(self, data: bytes) -> list[Event]:
        self.buf += data
        out: list[Event] = []
        while self.buf and self._step(out):
            pass
        return out

    def feed_eof(self) -> list[Event]:
        if self.state == "close":
            self.state = "head"
            return [End(b"")]
        return []

    def _opaque(self, out: list[Event]) -> bool:
        if self.state != "tunnel":
            self.state = "opaque"
        out.append(Opaque(self.buf))
        self.buf = b""
        return False

    def _step(self, out: list[Event]) -> bool:
        """Consume what can be consumed; False when more input is needed."""
        st = self.state
        if st in ("opaque", "tunnel"):
            return self._opaque(out)
        if st == "head":
            return self._head(out)
        if st in ("length", "chunk_data", "close"):
            take = self.buf if st == "close" else self.buf[:self.remaining]
            self.buf = self.buf[len(take):]
            out.append(Body(take, take))
            if st == "close":
                return False
            self.remaining -= len(take)
            if self.remaining == 0:
                if st == "length":
                    out.append(End(b""))
                    self.state = "head"
                else:
                    self.state = "chunk_crlf"
            return True
        if st == "chunk_crlf":
            if len(self.buf) < 2:
                return False
            if self.buf[:2] != b"\r\n":
                return self._opaque(out)
            self.buf = self.buf[2:]
            out.append(Body(b"", b"\r\n"))
            self.state = "chunk_size"
            return True
        if st == "chunk_size":
            i = self.buf.find(b"\r\n")
            if i < 0:
                return False if len(self.buf) <= MAX_CHUNK_LINE else self._opaque(out)
            line = self.buf[:i + 2]
            try:
                size = int(line[:-2].split(b";", 1)[0].strip(), 16)
            except ValueError:
                return self._opaque(out)
            self.buf = self.buf[i + 2:]
            if size == 0:
                self.last_line = line
                self.state = "trailers"
            else:
                self.remaining = size
                self.state = "chunk_data"
                out.append(Body(b"", line))
            return True
        if st == "trailers":
            if self.buf.startswith(b"\r\n"):
                end = 2
            else:
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    return False if len(self.buf) <= MAX_HEAD else self._opaque(out)
                end = i + 4
            out.append(End(self.last_line + self.buf[:end]))
            self.buf = self.buf[end:]
            self.state = "head"
            return True
        raise AssertionError(f"unknown parser state {st}")

    def _head(self, out: list[Event]) -> bool:
        if len(self.buf) < 5:
            return False if b"HTTP/".startswith(self.buf) else self._opaque(out)
        if not self.buf.startswith(b"HTTP/"):
            return self._opaque(out)
        i = self.buf.find(b"\r\n\r\n")
        if i < 0:
            return False if len(self.buf) <= MAX_HEAD else self._opaque(out)
        raw = self.buf[:i + 4]
        lines = raw[:-4].split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            return self._opaque(out)
        headers = []
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if sep:
                headers.append((k.strip().decode("latin-1"), v.strip().decode("latin-1")))
        self.buf = self.buf[i + 4:]
        head = Head(raw, status, headers, "none")
        if 100 <= status < 200:
            head.framing = "info"
            if status == 101:  # another protocol follows: never HTTP/1.1 framing again
                self.state = "tunnel"
            out.append(head)
            return True
        te = (head.header("transfer-encoding") or "").lower()
        cl = head.header("content-length")
        if self.method_of_request() == b"HEAD" or status in (204, 304):
            head.framing = "none"
        elif "chunked" in te:
            head.framing, self.state = "chunked", "chunk_size"
        elif cl is not None and cl.strip().isdigit():
            head.framing, self.state, self.remaining = "length", "length", int(cl)
        else:
            head.framing, self.state = "close", "close"
        out.append(head)
        if head.framing == "none" or (head.framing == "length" and self.remaining == 0):
            self.state = "head"
            out.append(End(b""))
        return True
