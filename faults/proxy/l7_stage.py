"""The response stage: where L7 toxics meet a connection's downstream bytes.

It is attached to a connection only at the start of a response (the first
downstream bytes after a request went up) and only while an L7 toxic applies
to that connection; it parses the framing of each response (``http_parse``)
and detaches again between responses once no L7 toxic is left, so a link
without L7 toxics pays nothing. Bytes it cannot frame pass untouched (and
are counted, ``l7_framing_lost``) until the connection's next exchange,
where it looks for a response head again. A response no toxic rewrites is
forwarded byte for byte. A rewritten body is re-framed: a chunked response stays
chunked (one output chunk per input piece, then the original last chunk and
trailers); an SSE response sent with Content-Length is turned into a
chunked one, since its length changes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .http_parse import Body, End, Head, Opaque, ResponseParser
from .sse import SseEvent, SseSplitter
from .toxics.base import Emit
from .toxics.l7 import L7Toxic, ResponseContext

if TYPE_CHECKING:  # pragma: no cover
    from .connection import Connection

log = logging.getLogger("ordeal.proxy")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class Rewrite:
    """How one response is being rewritten."""

    def __init__(self, head: Head, toxics: list[L7Toxic]):
        self.ctx = ResponseContext(toxics)
        self.toxics = toxics
        ctype = (head.header("content-type") or "").lower()
        self.sse = "text/event-stream" in ctype and any(t.needs_sse for t in toxics)
        limits = [n for n in (t.body_limit() for t in toxics) if n is not None]
        self.limit = min(limits) if limits else None
        self.active = self.sse or self.limit is not None
        self.after_stall: list[SseEvent] = []  # events a stall holds back
        self.in_framing = head.framing
        self.out_framing = head.framing
        self.splitter = SseSplitter()
        self.body_sent = 0
        self.finished = False  # the stream was ended early; discard the rest
        self.head_raw = head.raw
        if self.sse and head.framing == "length":
            self.head_raw = _to_chunked(head)
            self.out_framing = "chunked"
        for toxic in toxics:
            toxic.counters["responses"] += 1
            if self.sse and toxic.needs_sse:
                toxic.counters["sse_responses"] += 1

    def events(self, evs: list[SseEvent]) -> bytes:
        out: list[bytes] = []
        for i, ev in enumerate(evs):
            if self.ctx.finish_early:
                break
            if self.ctx.stall is not None:  # the rest waits out the stall (ResponseStage._body)
                self.after_stall = evs[i:]
                break
            batch = [ev]
            for toxic in self.toxics:
                nxt: list[SseEvent] = []
                for e in batch:
                    if toxic.removed.is_set():
                        nxt.extend(toxic.flush(self.ctx))
                        nxt.append(e)
                    else:
                        got = toxic.on_event(self.ctx, e)
                        if len(got) != 1 or got[0] is not e:
                            toxic.counters["events_changed"] += 1
                        nxt.extend(got)
                batch = nxt
            out.extend(e.raw for e in batch)
        return b"".join(out)

    def flush_events(self) -> bytes:
        out = self.events(self.splitter.flush())
        if self.ctx.finish_early:
            return out
        held: list[bytes] = []
        for toxic in self.toxics:
            held.extend(e.raw for e in toxic.flush(self.ctx))
        return out + b"".join(held)

    def framed(self, data: bytes) -> bytes:
        return chunk(data) if self.out_framing == "chunked" else data


def _to_chunked(head: Head) -> bytes:
    lines = head.raw[:-4].split(b"\r\n")
    kept = [lines[0]] + [ln for ln in lines[1:]
                         if not ln.lower().startswith((b"content-length:",
                                                       b"transfer-encoding:"))]
    return b"\r\n".join(kept + [b"transfer-encoding: chunked"]) + b"\r\n\r\n"


class ResponseStage:
    def __init__(self, conn: "Connection"):
        self.conn = conn
        self.parser = ResponseParser(lambda: conn.last_method)
        self.rw: Rewrite | None = None
        self._said_lost = False

    @property
    def detachable(self) -> bool:
        return self.parser.idle and self.rw is None and not self.conn.l7_toxics()

    @property
    def lost(self) -> bool:
        """The parser gave up on this exchange's framing (it passes it untouched)."""
        return self.parser.lost

    def resync(self) -> None:
        """A new exchange starts (the connection calls this at the first
        downstream bytes after a request): look for a response head again."""
        self.parser.resync()
        self.rw = None
        self._said_lost = False

    async def feed(self, data: bytes, emit: Emit) -> None:
        for ev in self.parser.feed(data):
            await self._on(ev, emit)

    async def feed_eof(self, emit: Emit) -> None:
        for ev in self.parser.feed_eof():
            await self._on(ev, emit)

    async def _on(self, ev: Head | Body | End | Opaque, emit: Emit) -> None:
        if isinstance(ev, Opaque):
            if self.parser.lost and not self._said_lost:
                self._said_lost = True
                conn = self.conn
                conn.link.l7_framing_lost += 1
                log.info("link %s conn %d: response framing lost (%r...); L7 toxics pass "
                         "the rest of this exchange untouched", conn.link.name, conn.id,
                         ev.raw[:40])
            await emit(ev.raw)
        elif isinstance(ev, Head):
            if ev.framing == "info":
                await emit(ev.raw)
                return
            toxics = self.conn.l7_toxics()
            self.rw = Rewrite(ev, toxics)
            self.rw.ctx.request_target = self.conn.last_target
            for toxic in toxics:
                await toxic.before_head(self.rw.ctx)
            await emit(self.rw.head_raw)
        elif isinstance(ev, Body):
            rw = self.rw
            if rw is None or not rw.active:
                await emit(ev.raw)
            elif not rw.finished and ev.data:
                await self._body(rw, ev.data, emit)
        elif isinstance(ev, End):
            rw, self.rw = self.rw, None
            if rw is None or not rw.active:
                await emit(ev.raw)
            elif not rw.finished:
                await self._body(rw, b"", emit, end=True)
                if not rw.finished:
                    await emit(self._terminator(rw, ev.raw))

    async def _body(self, rw: Rewrite, data: bytes, emit: Emit, end: bool = False) -> None:
        out = data
        if rw.sse:
            out = rw.events(rw.splitter.feed(data))
            while rw.ctx.stall is not None:  # send what came before, hold, go on
                toxic, seconds = rw.ctx.stall
                rw.ctx.stall = None
                if out:
                    await emit(rw.framed(out))
                    rw.body_sent += len(out)
                await toxic.hold(seconds)
                rest, rw.after_stall = rw.after_stall, []
                out = rw.events(rest)
            if end:
                out += rw.flush_events()
        if rw.limit is not None and rw.body_sent + len(out) >= rw.limit:
            cut = out[: rw.limit - rw.body_sent]
            if cut:
                await emit(rw.framed(cut))
            rw.finished = True
            self.conn.close(f"truncate_body: cut after {rw.limit} body bytes")
            return
        if out:
            await emit(rw.framed(out))
        rw.body_sent += len(out)
        if rw.ctx.finish_early and not end:
            rw.finished = True
            if rw.out_framing == "close":
                self.conn.close("sse_error_event: stream ended early (until-close body)")
            else:
                await emit(self._terminator(rw, b""))

    @staticmethod
    def _terminator(rw: Rewrite, original: bytes) -> bytes:
        if rw.out_framing != "chunked":
            return original
        return original if rw.in_framing == "chunked" and original else b"0\r\n\r\n"
