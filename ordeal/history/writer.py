"""The writer: ``History`` appends ops to a chunked history file (the format
is in ``ordeal/history/__init__.py``).

Each op is written to the OS as it is appended (a SIGKILLed harness loses
nothing it appended; only a machine crash can lose bytes not yet fsynced).
A chunk is sealed, and the file fsynced, every ``flush_interval`` seconds
(also when nothing is appended: a background thread does it), every
``chunk_max_ops`` ops or ``chunk_max_bytes`` bytes, and on flush()/close().
Ops after the last trailer are the unsealed tail: what a crashed writer
left. ``History.resume`` seals it and continues the same file, and
``record_gap`` then closes the requests the dead harness left in flight.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import crc32c

from .ops import MONITOR, NEMESIS, OP_TYPES, Op, OpType, parse_iso, utc_iso
from .reader import FORMAT_VERSION, HEADER_KEY, HistoryError, _positive, _Reader, _try_op
from .sealer import SEALER

DEFAULT_CHUNK_OPS = 4096
DEFAULT_CHUNK_BYTES = 4 << 20
GAP_ERROR = "harness died; outcome unknown"  # the error of a request a gap closes


class HistoryWriteError(OSError):
    """An op could not be written (disk full, I/O error). The file is cut
    back to its last whole line, so what was written stays readable; the run
    must stop, since nothing it does from here would be recorded."""



def _dumps(d: dict[str, Any]) -> bytes:
    return (json.dumps(d, separators=(",", ":")) + "\n").encode()


@dataclass
class Resumed:
    """What ``History.resume`` found in the file it continues."""

    ops: int = 0  # ops read back (verified chunks and the tail it sealed)
    last_index: int | None = None
    last_time_ns: int | None = None
    last_wall: str | None = None
    # Client invokes with no completion yet, in index order: what was in
    # flight when the harness died. ``record_gap`` completes them.
    open_invokes: list[Op] = field(default_factory=list)
    sealed_tail_ops: int = 0  # unsealed ops (the crash's tail) this resume sealed
    dropped_lines: int = 0  # torn or garbled lines removed from that tail
    rejected_chunks: int = 0  # chunks that failed verification (their ops are not used)
    chunks: int = 0  # sealed chunks in the file after the resume
    time_offset_ns: int = 0  # added to time.monotonic_ns() so time_ns never goes back
    problems: list[str] = field(default_factory=list)  # every damage found, as reported
    # The segments the file already holds (one per harness that wrote it,
    # split at its ``monitor``/``gap`` ops), each as ``History.segments``
    # lists them: what a summary reports of the harnesses before this one.
    segments: list[dict[str, Any]] = field(default_factory=list)
    # ``record_gap``'s gap (from, to, down_s): what this segment resumed from.
    gap: dict[str, Any] | None = None


class History:
    """Append-only recorder. Thread-safe: the workload and the nemesis share it.

    Each op goes to the OS when appended; chunks are sealed (trailer line,
    CRC-32C) and fsynced every ``flush_interval`` seconds, every
    ``chunk_max_ops`` ops or ``chunk_max_bytes`` bytes, and on flush() and
    close(). Nothing is kept in memory but counters and the running CRC.

    ``History(path)`` starts a new file (an existing non-empty one is
    refused: ``History.resume`` continues it). The file is locked
    (``flock``) while open, so two writers can never share it; the lock goes
    with the process, so a SIGKILLed harness leaves none behind.
    """

    resumed: Resumed | None = None

    def __init__(self, path: str | os.PathLike[str], flush_interval: float = 0.5,
                 chunk_max_ops: int = DEFAULT_CHUNK_OPS,
                 chunk_max_bytes: int = DEFAULT_CHUNK_BYTES):
        if chunk_max_ops < 1 or chunk_max_bytes < 1:
            raise ValueError("chunk_max_ops and chunk_max_bytes must be at least 1")
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        f = _open_locked(p)
        try:
            if os.fstat(f.fileno()).st_size:
                raise HistoryError(f"{p} already holds a history; History.resume({str(p)!r}) "
                                   "continues it, or give a new path")
            header = _dumps({"chunk": -1, HEADER_KEY: FORMAT_VERSION,
                             "chunk_max_ops": chunk_max_ops, "chunk_max_bytes": chunk_max_bytes,
                             "created": utc_iso(), "created_time_ns": time.monotonic_ns()})
            _write_all(f, header)
        except BaseException:
            f.close()
            raise
        self._setup(p, f, flush_interval, chunk_max_ops, chunk_max_bytes,
                    next_index=0, next_chunk=0, size=len(header))
        SEALER.add(self)

    def _setup(self, path: Path, f: Any, flush_interval: float, chunk_max_ops: int,
               chunk_max_bytes: int, next_index: int, next_chunk: int, size: int) -> None:
        self.path = path
        self._file: Any = f  # a raw (unbuffered) binary file: one write per op
        self._lock = threading.Lock()  # the appenders
        self._sync_lock = threading.Lock()  # fsync and close of the file
        self._flush_interval = flush_interval
        self._max_ops = chunk_max_ops
        self._max_bytes = chunk_max_bytes
        self._next_index = next_index
        self._next_chunk = next_chunk
        self._size = size  # bytes in the file: an append that fails is cut back to it
        self._time_offset_ns = 0
        # The open chunk: counts and the running CRC only, never its ops.
        self._chunk_ops = 0
        self._chunk_bytes = 0
        self._chunk_crc = 0
        self._chunk_first = 0
        self._chunk_started = 0.0
        self._unsynced = True  # the header (or a resume's repair) is not fsynced yet
        self.counts: dict[str, int] = {t: 0 for t in OP_TYPES}
        self.nemesis_counts: dict[str, int] = {t: 0 for t in OP_TYPES}

    # -- writing ----------------------------------------------------------------
    def append(
        self,
        type: OpType,
        process: int | str,
        f: str,
        value: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> Op:
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"history {self.path} is closed; no op can be added")
            op = Op(
                index=self._next_index,
                time_ns=time.monotonic_ns() + self._time_offset_ns,
                wall=utc_iso(),
                type=type,
                process=process,
                f=f,
                value=value or {},
                error=error,
            )
            sealed = self._commit_locked((op.to_json() + "\n").encode(), type, process)
        if sealed:
            SEALER.poke()  # the fsync, off this thread
        return op

    def append_encoded(self, type: OpType, process: int | str, f: str, value_json: str,
                       error: str | None = None) -> int:
        """``append`` for a value already encoded as JSON (compact, not
        ASCII-escaped, as ``Op.to_json`` does): the same line, byte for
        byte. A load worker encodes its ops' values itself
        (load/workers.py), so the one writer does not spend its core on
        them. Returns the op's index."""
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"history {self.path} is closed; no op can be added")
            index = self._next_index
            head = json.dumps({"index": index,
                               "time_ns": time.monotonic_ns() + self._time_offset_ns,
                               "wall": utc_iso(), "type": type, "process": process, "f": f},
                              separators=(",", ":"), ensure_ascii=False)
            line = (f'{head[:-1]},"value":{value_json},"error":'
                    f'{json.dumps(error, ensure_ascii=False)}}}\n').encode()
            sealed = self._commit_locked(line, type, process)
        if sealed:
            SEALER.poke()
        return index

    def _commit_locked(self, line: bytes, type: OpType, process: int | str) -> bool:
        """One op's line into the file and the open chunk (the lock held);
        True when the chunk was sealed and wants its fsync."""
        self._write(line)
        index = self._next_index
        self._next_index += 1
        if self._chunk_ops == 0:
            self._chunk_first = index
            self._chunk_started = time.monotonic()
        self._chunk_ops += 1
        self._chunk_bytes += len(line)
        self._chunk_crc = crc32c.crc32c(line, self._chunk_crc)
        if process == NEMESIS:
            self.nemesis_counts[type] += 1
        elif process != MONITOR:
            self.counts[type] += 1
        if (self._chunk_ops >= self._max_ops or self._chunk_bytes >= self._max_bytes
                or time.monotonic() - self._chunk_started >= self._flush_interval):
            return self._seal_locked()
        return False

    def _write(self, data: bytes) -> None:
        try:
            _write_all(self._file, data)
        except BaseException as e:
            try:  # no half line left for the next op to glue onto
                os.ftruncate(self._file.fileno(), self._size)
            except OSError:
                pass
            if isinstance(e, OSError) and not isinstance(e, HistoryWriteError):
                raise HistoryWriteError(
                    e.errno, f"history {self.path}: cannot write op {self._next_index} "
                    f"({e.strerror or e}); the file is intact up to op "
                    f"{self._next_index - 1} (its last whole line). Free space on "
                    f"{self.path.parent} and start again, or `--resume` an endurance "
                    "run") from e
            raise
        self._size += len(data)

    def _seal_locked(self) -> bool:
        if self._chunk_ops == 0:
            return False
        self._write(_dumps({"chunk": self._next_chunk, "first": self._chunk_first,
                            "ops": self._chunk_ops, "bytes": self._chunk_bytes,
                            "crc32c": f"{self._chunk_crc:08x}"}))
        self._next_chunk += 1
        self._chunk_ops = self._chunk_bytes = self._chunk_crc = 0
        self._unsynced = True
        return True

    def _fsync(self, f: Any) -> None:
        with self._sync_lock:
            if not f.closed:
                os.fsync(f.fileno())

    def _tick(self) -> None:
        """The sealer thread: seal an idle chunk that is due, then fsync."""
        with self._lock:
            f = self._file
            if f is None:
                return
            if self._chunk_ops and time.monotonic() - self._chunk_started >= self._flush_interval:
                self._seal_locked()
            if not self._unsynced:
                return
            self._unsynced = False
        self._fsync(f)

    def now_ns(self) -> int:
        """The ``time_ns`` an op appended now would get (the monotonic clock,
        continued across a resume). Store it to measure a duration against a
        later op's ``time_ns``: unlike the wall clock, it never steps."""
        return time.monotonic_ns() + self._time_offset_ns

    def flush(self) -> None:
        """Seal the open chunk and fsync: everything appended so far is
        verified and on disk when this returns."""
        with self._lock:
            f = self._file
            if f is None:
                return
            self._seal_locked()
            self._unsynced = False
        self._fsync(f)

    def close(self) -> None:
        with self._lock:
            f = self._file
            if f is None:
                return
            try:
                self._seal_locked()
            finally:
                self._file = None
        SEALER.discard(self)
        with self._sync_lock:
            try:
                os.fsync(f.fileno())
            finally:
                f.close()  # and the lock with it

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resuming ---------------------------------------------------------------
    @classmethod
    def resume(cls, path: str | os.PathLike[str], flush_interval: float = 0.5,
               on_error: Callable[[str], None] | None = None) -> "History":
        """Continue the history at ``path`` after its harness died.

        Reads and verifies the file once (streaming; every damage goes to
        ``on_error`` and to ``resumed.problems``, never raises for it),
        removes a torn final line and any garbled line of the unsealed tail,
        seals that tail with a trailer, and continues: the next op's index
        is one past the highest in the file, the next chunk's number one past
        the last. ``counts`` and ``nemesis_counts`` start from the file's ops,
        so a summary covers both halves. ``resumed`` (a Resumed) says what
        was found, with the invokes still in flight; call ``record_gap``
        next. A missing or empty file starts a new history. Refused
        (HistoryError) while another writer holds the file, and for a
        plain-JSONL file of before format 2.
        """
        p = Path(path)
        if not p.exists() or p.stat().st_size == 0:
            h = cls(p, flush_interval)
            h.resumed = Resumed()
            return h
        f = _open_locked(p)
        try:
            h, resumed = cls._repair(p, f, flush_interval, on_error)
        except BaseException:
            f.close()
            raise
        h.resumed = resumed
        SEALER.add(h)
        return h

    @classmethod
    def _repair(cls, p: Path, f: Any, flush_interval: float,
                on_error: Callable[[str], None] | None) -> tuple["History", Resumed]:
        f.seek(0)
        if HEADER_KEY.encode() not in f.readline():
            raise HistoryError(f"{p} is plain JSON Lines, written before the chunked format "
                               f"{FORMAT_VERSION}: it cannot be resumed; start a new history")
        r = Resumed()

        def report(msg: str) -> None:
            r.problems.append(msg)
            if on_error is not None:
                on_error(msg)

        counts = {t: 0 for t in OP_TYPES}
        nemesis_counts = {t: 0 for t in OP_TYPES}
        open_invokes: dict[Any, Op] = {}  # bounded by what was in flight
        max_index = -1
        last: Op | None = None
        seg_start: Op | None = None  # the gap op that began the segment being read
        seg_first: Op | None = None  # the first op of the file (segment 0's start)
        reader = _Reader(p, report, on_note=lambda _msg: None)
        for op in reader.ops():
            r.ops += 1
            if op.process == MONITOR and op.f == "gap":  # a harness died before this op
                r.segments.append(_segment(reader.header, seg_start, seg_first, last))
                seg_start = op
            seg_first = seg_first or op
            last = op
            max_index = max(max_index, op.index)
            if op.process == NEMESIS:
                nemesis_counts[op.type] += 1
            elif op.process == MONITOR:
                pass
            else:
                counts[op.type] += 1
                if op.type == "invoke":
                    open_invokes[op.process] = op
                else:
                    open_invokes.pop(op.process, None)
        if reader.header is None:
            raise HistoryError(f"{p}: its first line is not a history header: it cannot be "
                               "resumed; start a new history")
        r.segments.append(_segment(reader.header, seg_start, seg_first, last))
        r.rejected_chunks = reader.rejected
        max_ops = _positive(reader.header.get("chunk_max_ops"), DEFAULT_CHUNK_OPS)
        max_bytes = _positive(reader.header.get("chunk_max_bytes"), DEFAULT_CHUNK_BYTES)

        # The unsealed tail: at most one chunk's lines, after the last trailer.
        start = reader.tail_offset
        region = b""
        while len(region) < reader.end_offset - start:
            more = os.pread(f.fileno(), reader.end_offset - start - len(region),
                            start + len(region))
            if not more:
                break
            region += more
        lines = [line + b"\n" for line in region.split(b"\n")]
        lines[-1] = lines[-1][:-1]  # what follows the last newline: b"" or a torn line
        good: list[bytes] = []
        bad_from: int | None = None  # offset (in region) of the first bad line
        bad_between = False
        pos = 0
        first_index: int | None = None
        for raw in filter(None, lines):
            op = _try_op(raw, reader.loads)
            if op is None:
                if raw.strip():
                    r.dropped_lines += 1
                    if bad_from is None:
                        bad_from = pos
                elif bad_from is None:
                    bad_from = pos  # a blank line: dropped silently if nothing follows
            else:
                if bad_from is not None:
                    bad_between = True
                if first_index is None:
                    first_index = op.index
                good.append(raw if raw.endswith(b"\n") else raw + b"\n")
            pos += len(raw)
        if bad_between:  # rare (a garbled line, not a crash): rewrite the tail clean
            os.ftruncate(f.fileno(), start)
            _write_all(f, b"".join(good))  # O_APPEND: at the new end
        else:  # the crash's case: cut what follows the last good line
            keep = start + (bad_from if bad_from is not None else len(region))
            if keep < reader.end_offset:
                os.ftruncate(f.fileno(), keep)
            if good and not region[:keep - start].endswith(b"\n"):
                _write_all(f, b"\n")  # a last op complete but for its newline
        if r.dropped_lines:
            report(f"{p}: resume removed {r.dropped_lines} torn or garbled line(s) from the "
                   f"unsealed tail (from byte {start}); the ops around them are kept")
        size = f.seek(0, os.SEEK_END)
        h = cls.__new__(cls)
        h._setup(p, f, flush_interval, max_ops, max_bytes,
                 next_index=max(max_index, reader.max_claimed_index) + 1,
                 next_chunk=reader.last_chunk + 1, size=size)
        if good:  # seal the tail as the writer would have
            data = b"".join(good)
            h._chunk_ops, h._chunk_bytes = len(good), len(data)
            h._chunk_crc, h._chunk_first = crc32c.crc32c(data), int(first_index or 0)
            h._seal_locked()
            r.sealed_tail_ops = len(good)
        os.fsync(f.fileno())
        h._unsynced = False
        h.counts, h.nemesis_counts = counts, nemesis_counts
        r.chunks = h._next_chunk
        r.open_invokes = sorted(open_invokes.values(), key=lambda o: o.index)
        if last is not None:
            r.last_index, r.last_time_ns, r.last_wall = last.index, last.time_ns, last.wall
            now_ns = time.monotonic_ns()
            if now_ns <= last.time_ns:  # the machine rebooted: monotonic time restarted
                then = parse_iso(last.wall)
                down_ns = max(1, int((time.time() - then) * 1e9)) if then is not None else 1
                r.time_offset_ns = h._time_offset_ns = last.time_ns + down_ns - now_ns
        return h, r

    def record_gap(self, reason: str = "harness died",
                   open_invokes: Iterable[Op] | None = None) -> Op:
        """After ``resume``: record the hole the dead harness left, so that
        no request is lost or counted twice. Appends one ``info`` op of the
        process ``monitor`` with ``f="gap"`` (value: from/to wall times, the
        seconds down, the reason, how many requests were open), then one
        ``info`` completion (error GAP_ERROR: it may have run) for each
        invoke that was in flight. ``open_invokes`` defaults to
        ``resumed.open_invokes``, which is then emptied (a second call
        completes nothing twice). Returns the gap op."""
        r = self.resumed or Resumed()
        opens = list(r.open_invokes if open_invokes is None else open_invokes)
        now = utc_iso()
        # How long the harness was down, on the history's own clock (the
        # monotonic one, continued across a reboot by the resume's offset):
        # the wall clock may have been stepped meanwhile, even backwards.
        down_s = (round(max(0, self.now_ns() - r.last_time_ns) / 1e9, 3)
                  if r.last_time_ns is not None else None)
        gap = self.append("info", MONITOR, "gap", {
            "from": r.last_wall, "to": now, "down_s": down_s,
            "reason": reason, "open_invokes": len(opens), "ops_before": r.ops,
            "last_index_before": r.last_index, "time_offset_ns": r.time_offset_ns})
        for inv in opens:
            value = {k: inv.value[k] for k in ("seq", "request_id") if k in inv.value}
            self.append("info", inv.process, inv.f,
                        {**value, "invoke_index": inv.index, "gap": True}, GAP_ERROR)
        if open_invokes is None:
            r.open_invokes = []
        if self.resumed is not None:
            self.resumed.gap = _gap_of(gap)
        return gap

    def segments(self, started: str, ended: str, duration_s: float | None) -> list[dict[str, Any]]:
        """The run's segments, one per harness that wrote this history, in
        order: ``{started, ended, duration_s}``, and ``resumed_from_gap``
        (``from``, ``to``, ``down_s``: the gap op ``record_gap`` wrote) on
        each after the first. Those before this harness come from the file
        (``resumed.segments``): a SIGKILLed harness wrote no summary, and the
        history is what survives it. The last is this harness's own, as its
        caller measured it (``started`` .. ``ended``, ``duration_s``).

        An earlier segment runs from its start (the header's ``created``
        for the first, its gap op for a later one) to its last op, and its
        ``duration_s`` is measured on the ops' ``time_ns`` (monotonic,
        continued across a resume): the last op is the last moment the
        history can show that harness alive."""
        current: dict[str, Any] = {"started": started, "ended": ended,
                                   "duration_s": None if duration_s is None
                                   else round(max(0.0, duration_s), 3)}
        r = self.resumed
        if r is None:
            return [current]
        if r.gap is not None:
            current["resumed_from_gap"] = dict(r.gap)
        return [dict(s) for s in r.segments] + [current]


def _gap_of(op: Op) -> dict[str, Any]:
    """A gap op as a segment's ``resumed_from_gap``."""
    return {"from": op.value.get("from"), "to": op.value.get("to") or op.wall,
            "down_s": op.value.get("down_s")}


def _segment(header: dict[str, Any] | None, start: Op | None, first: Op | None,
             last: Op | None) -> dict[str, Any]:
    """A segment already in the file: from ``start`` (its gap op; None: the
    file's first segment, which starts at the header's ``created``, or at
    its ``first`` op in a header of before ``created_time_ns``) to ``last``,
    its last op."""
    header = header or {}
    if start is not None:
        wall, ns = start.value.get("to") or start.wall, start.time_ns
    else:
        created_ns = header.get("created_time_ns")
        wall = header.get("created") or (first.wall if first else None)
        ns = created_ns if isinstance(created_ns, int) else (first.time_ns if first else None)
    seg: dict[str, Any] = {
        "started": wall, "ended": last.wall if last is not None else wall,
        "duration_s": (round(max(0, last.time_ns - ns) / 1e9, 3)
                       if last is not None and ns is not None else 0.0)}
    if start is not None:
        seg["resumed_from_gap"] = _gap_of(start)
    return seg


def _open_locked(p: Path) -> Any:
    f = open(p, "a+b", buffering=0)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise HistoryError(f"{p} is open for writing by another History (is its harness still "
                           "running?); a history has one writer at a time") from None
    return f


def _write_all(f: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = f.write(view)
        view = view[n:]
