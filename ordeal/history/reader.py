"""The reader: ``read_history`` streams a whole history, ``HistoryTail``
follows one as it grows; both verify each chunk the same way.

Each chunk is verified before any of its ops is yielded; a chunk that fails
(CRC, counts, a damaged trailer, a number out of sequence) is rejected
whole and reported, and the other chunks are still read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import crc32c

from .ops import Op

FORMAT_VERSION = 2
HEADER_KEY = "ordeal_history"


class HistoryError(ValueError):
    """A history file that cannot be trusted; the message says where and why."""


def _positive(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def _loads() -> Callable[[str | bytes], Any]:
    try:  # 3-4x faster on long histories; a dependency of vLLM, optional here
        import orjson

        return orjson.loads
    except ImportError:
        return json.loads


REQUIRED = ("index", "time_ns", "wall", "type", "process", "f")
_TRAILER_FIELDS = ("first", "ops", "bytes")


def _parse_op(raw: bytes, loads: Callable[[bytes], Any]) -> Op:
    d = loads(raw)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise ValueError(f"missing {missing}: written by an older or other format?")
    return Op.from_dict(d)


def _try_op(raw: bytes, loads: Callable[[bytes], Any]) -> Op | None:
    try:
        return _parse_op(raw, loads)
    except (ValueError, KeyError, TypeError):
        return None


class _Reader:
    """One streaming pass over a history: the whole file (``ops``), or the
    file as it grows (``scan`` again with the lines added since, ``rest``
    once the writer is done). What it learns about the file's shape (for
    ``History.resume``) is left in its attributes."""

    def __init__(self, path: Path, on_error: Callable[[str], None] | None,
                 on_note: Callable[[str], None] | None = None):
        self.path = path
        self.on_error = on_error
        self.on_note = on_note if on_note is not None else on_error
        self.loads = _loads()
        self.header: dict[str, Any] | None = None  # None: plain JSONL (format 1)
        self.last_chunk = -1  # the highest chunk number of a trailer seen
        self.max_claimed_index = -1  # the highest op index a trailer vouched for
        self.rejected = 0
        self.tail_offset = 0  # where the unsealed tail begins (after the last trailer)
        self.end_offset = 0
        # Where the scan is, kept between calls of ``scan`` (HistoryTail).
        self.started = False  # line 1 (the header, or a plain file's first op) was read
        self.cap = 1 << 16  # the most op lines a chunk may hold (from the header)
        self.lineno = 0
        self.offset = 0
        self.pending: list[bytes] = []  # the op lines since the last trailer
        self.start_line, self.start_off = 2, 0  # where those begin

    def _damage(self, msg: str, suffix: str) -> None:
        if self.on_error is None:
            raise HistoryError(msg + suffix)
        self.on_error(msg)

    def _bad_line(self, raw: bytes, lineno: int, e: Exception) -> None:
        torn = not raw.endswith(b"\n")
        what = "torn final line (a crash mid-write)" if torn else "not a valid op"
        msg = f"{self.path}:{lineno}: {what} ({e}): {raw[:120]!r}"
        if self.on_error is None:
            raise HistoryError(msg + ". Ops on other lines are intact.") from e
        self.on_error(msg)

    def ops(self) -> Iterator[Op]:
        """Every op of the file, verified: the sealed chunks, then the
        unsealed tail."""
        with self.path.open("rb") as fh:
            yield from self.scan(fh)
        yield from self.rest()

    def scan(self, lines: Iterable[bytes]) -> Iterator[Op]:
        """The ops of ``lines``, the file's next lines in order (the first
        call starts at line 1): a plain file's op by op, a chunked file's
        each chunk once its trailer has come and verified it. The op lines
        after the last trailer wait in ``pending`` for the next call, or for
        ``rest``."""
        it = iter(lines)
        if not self.started:
            first = next(it, None)
            if first is None:
                return
            self.started = True
            self.header = self._header(first)
            if self.header is None:  # format 1: line by line, as it was always read
                yield from self._plain([first])
            else:
                self.lineno = 1
                self.offset = self.start_off = self.tail_offset = self.end_offset = len(first)
                self.cap = _positive(self.header.get("chunk_max_ops"), 1 << 16)
        if self.header is None:
            yield from self._plain(it)
        else:
            yield from self._chunked(it)

    def _plain(self, lines: Iterable[bytes]) -> Iterator[Op]:
        loads = self.loads
        for raw in lines:
            self.lineno += 1
            if not raw.strip():
                continue
            try:
                d = loads(raw)
                if not isinstance(d, dict):
                    raise ValueError("not a JSON object")
                missing = [k for k in REQUIRED if k not in d]
                if missing:
                    raise ValueError(f"missing {missing}: written by an older or other "
                                     "format?")
                op = Op.from_dict(d)
            except (ValueError, KeyError, TypeError) as e:
                self._bad_line(raw, self.lineno, e)
                continue
            yield op

    def _chunked(self, lines: Iterable[bytes]) -> Iterator[Op]:
        """Format 2: verify each chunk whole before any of its ops is used.
        One generator with the loops inline and its state in locals (saved
        back when it ends): this is the hot path of every checker pass."""
        p, loads, cap = self.path, self.loads, self.cap
        pending, lineno, offset = self.pending, self.lineno, self.offset
        start_line, start_off = self.start_line, self.start_off
        try:
            for raw in lines:
                lineno += 1
                # Ops are written with "index" first: only other lines are looked at.
                if not raw.startswith(b'{"index"') and raw.endswith(b"\n"):
                    kind, got = self._classify(raw)
                    if kind != "op":
                        where = (f"lines {start_line}-{lineno}, "
                                 f"bytes {start_off}-{offset + len(raw)}")
                        ok = kind == "trailer" and self._verify(got, pending, where)
                        if kind != "trailer":
                            n = self.last_chunk = self.last_chunk + 1
                            self.rejected += 1
                            self._damage(
                                f"{p}: chunk {n} ({where}): its trailer (line {lineno}) is "
                                f"damaged ({got}): {raw[:120]!r}; the chunk cannot be verified "
                                f"and its {len(pending)} ops are not used; the other chunks are "
                                "read on", ". Ops in other chunks are intact.")
                        offset += len(raw)
                        chunk, pending = pending, []
                        chunk_line = start_line
                        start_line, start_off = lineno + 1, offset
                        self.tail_offset = offset
                        if ok:  # verified: every line is what the writer wrote
                            n = chunk_line - 1
                            for line in chunk:
                                n += 1
                                try:
                                    op = _parse_op(line, loads)
                                except (ValueError, KeyError, TypeError) as e:
                                    self._bad_line(line, n, e)
                                    continue
                                yield op
                        continue
                pending.append(raw)
                offset += len(raw)
                if len(pending) > cap:
                    self.rejected += 1
                    self._damage(
                        f"{p}: lines {start_line}-{lineno} (bytes {start_off}-{offset}): "
                        f"{len(pending)} lines without a trailer, more than a chunk holds "
                        f"({cap}): a trailer was lost or lines were added; they cannot be "
                        "verified and are not used; the other chunks are read on",
                        ". Ops in other chunks are intact.")
                    pending = []
                    start_line, start_off = lineno + 1, offset
                    self.tail_offset = offset
        finally:
            self.pending, self.lineno, self.offset = pending, lineno, offset
            self.start_line, self.start_off = start_line, start_off
            self.end_offset = offset

    def rest(self) -> Iterator[Op]:
        """The unsealed tail: the writer died (or is still writing) before
        sealing it. Each whole op is used; a torn or garbled line is
        reported as in a plain file; a note says how many went unverified."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        n_ops = 0
        n = self.start_line - 1
        for line in pending:
            n += 1
            if not line.strip():
                continue
            try:
                op = _parse_op(line, self.loads)
            except (ValueError, KeyError, TypeError) as e:
                self._bad_line(line, n, e)
                continue
            n_ops += 1
            yield op
        if n_ops and self.on_note is not None:
            self.on_note(f"{self.path}: lines {self.start_line}-{n}: {n_ops} ops after the last "
                         f"sealed chunk (chunk {self.last_chunk}) are unverified: the writer did "
                         "not seal them (it crashed, or is still writing); they are used as "
                         "read")

    def _header(self, first: bytes) -> dict[str, Any] | None:
        if HEADER_KEY.encode() not in first:
            return None
        try:
            d = self.loads(first)
        except ValueError as e:
            self._damage(f"{self.path}:1: the header is damaged ({e}): {first[:120]!r}; "
                         "chunks are verified all the same", ".")
            return {}
        if not isinstance(d, dict) or HEADER_KEY not in d or "index" in d:
            return None  # an op that mentions the key: a plain file
        if d.get(HEADER_KEY) != FORMAT_VERSION:
            self._damage(f"{self.path}:1: history format {d.get(HEADER_KEY)!r}, this Ordeal "
                         f"reads {FORMAT_VERSION}; reading it as {FORMAT_VERSION}", ".")
        return d

    def _classify(self, raw: bytes) -> tuple[str, Any]:
        """("trailer", dict), ("damaged", reason) or ("op", None) for a line
        that does not start as an op does."""
        try:
            d = self.loads(raw)
        except ValueError as e:
            if (b'"crc32c"' in raw or b'"chunk"' in raw) and b'"time_ns"' not in raw:
                return "damaged", f"not valid JSON: {e}"
            return "op", None  # a garbled op line: its chunk's check names it
        if not isinstance(d, dict) or "index" in d:
            return "op", None  # not a trailer
        if "chunk" in d or "crc32c" in d:
            if isinstance(d.get("chunk"), int) and not isinstance(d.get("chunk"), bool):
                return "trailer", d
            return "damaged", f"its chunk number is {d.get('chunk')!r}"
        return "op", None

    def _verify(self, t: dict[str, Any], pending: list[bytes], where: str) -> bool:
        """Check a chunk against its trailer; report and return False if it
        fails (the whole chunk is then not used)."""
        n = t["chunk"]
        expected = self.last_chunk + 1
        self.last_chunk = max(self.last_chunk, n)
        fields_ok = all(isinstance(t.get(k), int) and not isinstance(t.get(k), bool)
                        for k in _TRAILER_FIELDS) and isinstance(t.get("crc32c"), str)
        if fields_ok:
            first, ops = t["first"], t["ops"]
            self.max_claimed_index = max(self.max_claimed_index, first + ops - 1)
            where += f", ops {first}-{first + ops - 1}"
        reason = None
        if n != expected:
            reason = (f"out of sequence: chunk {n} where chunk {expected} was due "
                      "(a chunk repeated, reordered, or lost)")
        elif not fields_ok:
            reason = (f"its trailer is damaged: {t!r:.160} lacks a count in "
                      f"{list(_TRAILER_FIELDS)} or the crc32c")
        elif len(pending) != t["ops"]:
            reason = (f"it holds {len(pending)} lines where its trailer says {t['ops']} ops: "
                      "lines were added or removed")
        else:
            data = b"".join(pending)
            computed = crc32c.crc32c(data)
            if len(data) != t["bytes"]:
                reason = (f"it holds {len(data)} bytes where its trailer says {t['bytes']}: "
                          "the chunk was altered after it was written")
            elif f"{computed:08x}" != t["crc32c"].lower():
                reason = (f"CRC-32C mismatch (stored {t['crc32c']}, computed {computed:08x}): "
                          "the chunk was altered after it was written")
            elif pending:
                op0 = _try_op(pending[0], self.loads)
                if op0 is not None and op0.index != t["first"]:
                    reason = (f"its first op is index {op0.index} where its trailer says "
                              f"{t['first']}")
        if reason is None:
            return True
        self.rejected += 1
        self._damage(f"{self.path}: chunk {n} ({where}): {reason}; its {len(pending)} ops are "
                     "not used; the other chunks are read on", ". Ops in other chunks are intact.")
        return False


def read_history(
    path: str | os.PathLike[str], on_error: Callable[[str], None] | None = None
) -> Iterator[Op]:
    """Stream ops from a history, verifying each chunk (memory: one chunk).

    Nothing is silently dropped. Damage is reported with ``on_error``,
    naming the file, the chunk or line, and the reason, and reading goes on
    so the rest is still checked; without ``on_error`` it raises
    HistoryError. A chunk that fails verification (CRC-32C, byte or op
    count, first index, a damaged trailer, or a chunk number that is not
    the previous + 1: a repeated or reordered chunk) is rejected whole: none
    of its ops is yielded.

    The unsealed tail (ops after the last trailer: the writer crashed, or is
    still writing) is yielded op by op as read, since each line is a whole
    op the writer wrote; a torn or garbled line there is reported as in a
    plain file, and a note (through ``on_error`` only, never raised) says
    how many ops went unverified. A plain JSONL file (no header, format 1)
    is read line by line exactly as before, with no note.
    """
    return _Reader(Path(path), on_error).ops()


class HistoryTail:
    """Follows a history while its writer appends to it, for a live
    consumer (the endurance judge). Each ``read_new`` yields the ops of the
    chunks sealed since the last call, verified exactly as ``read_history``
    verifies them (the same checks, the same messages through ``on_error``,
    or the same HistoryError without it); the ops of the open chunk wait for
    its trailer (the writer seals one at least every ``flush_interval``), so
    each op is yielded once, and only verified. A line still being written
    is left for the next call. A plain file (format 1) is followed line by
    line.

    When the writer has stopped (closed, or dead), ``read_rest`` yields what
    is left as ``read_history`` would: the unsealed tail op by op with a note
    through ``on_note`` (default ``on_error``), a torn last line reported.
    Exhaust each iterator: one left half-read loses the tail its place.
    Memory: one chunk. A tail follows one writer: a file a resume repaired
    is read by a new tail from its start."""

    def __init__(self, path: str | os.PathLike[str],
                 on_error: Callable[[str], None] | None = None,
                 on_note: Callable[[str], None] | None = None):
        self.path = Path(path)
        self._reader = _Reader(self.path, on_error, on_note)
        self._pos = 0  # bytes handed to the reader (whole lines, until read_rest)

    def read_new(self) -> Iterator[Op]:
        """The ops of every chunk sealed since the last call."""
        return self._read(final=False)

    def read_rest(self) -> Iterator[Op]:
        """Everything left, the writer being done: the chunks sealed since
        the last call, then the unsealed tail and a torn last line."""
        return self._read(final=True)

    def _read(self, final: bool) -> Iterator[Op]:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return
        with fh:
            fh.seek(self._pos)
            yield from self._reader.scan(self._lines(fh, final))
        if final:
            yield from self._reader.rest()

    def _lines(self, fh: Any, final: bool) -> Iterator[bytes]:
        for raw in fh:
            if not final and not raw.endswith(b"\n"):
                return  # being written: read it next time
            self._pos += len(raw)
            yield raw
