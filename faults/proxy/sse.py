"""SSE events as the L7 toxics see them: whole events cut from a response
body at their blank line, each with its raw bytes (so what passes untouched
is byte-identical) and, for data events, an ordinal in the original stream
(so "after 3 events" means the same thing whatever other toxics do)."""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_PENDING = 1 << 20  # an "event" this long without a blank line: pass it on as is


@dataclass(frozen=True)
class SseEvent:
    raw: bytes  # the event as sent, blank line included
    data: str | None  # joined data lines, None for comments / events without data
    index: int | None = None  # ordinal among the stream's data events ([DONE] excluded)

    @property
    def done(self) -> bool:
        return self.data is not None and self.data.strip() == "[DONE]"

    @classmethod
    def of_data(cls, text: str, index: int | None = None) -> "SseEvent":
        return cls(b"data: " + text.encode() + b"\n\n", text, index)

    @classmethod
    def error(cls, message: str, code: int = 500) -> "SseEvent":
        return cls.of_data(json.dumps({"error": {"object": "error", "message": message,
                                                 "type": "ordeal_fault", "param": None,
                                                 "code": code}}))


class SseSplitter:
    """Cuts a body into events. Bytes after the last blank line wait for
    the next piece; ``flush`` returns them at the end of the body."""

    def __init__(self) -> None:
        self.buf = b""
        self.next_index = 0

    def feed(self, data: bytes) -> list[SseEvent]:
        self.buf += data
        out: list[SseEvent] = []
        while True:
            lf = self.buf.find(b"\n\n")
            crlf = self.buf.find(b"\r\n\r\n")
            if lf < 0 and crlf < 0:
                break
            if crlf >= 0 and (lf < 0 or crlf < lf):
                end = crlf + 4
            else:
                end = lf + 2
            raw, self.buf = self.buf[:end], self.buf[end:]
            out.append(self._event(raw))
        if len(self.buf) > MAX_PENDING:
            out.append(SseEvent(self.buf, None))
            self.buf = b""
        return out

    def flush(self) -> list[SseEvent]:
        if not self.buf:
            return []
        raw, self.buf = self.buf, b""
        return [self._event(raw)]

    def _event(self, raw: bytes) -> SseEvent:
        data_lines = []
        for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
            if line.startswith(b"data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
        if not data_lines:
            return SseEvent(raw, None)
        data = b"\n".join(data_lines).decode("utf-8", errors="replace")
        if data.strip() == "[DONE]":
            return SseEvent(raw, data)
        ev = SseEvent(raw, data, self.next_index)
        self.next_index += 1
        return ev
