"""The history: one record per event, in the order the harness saw them.

Modelled on Jepsen's history. Every request is an ``invoke`` op followed by
exactly one completion: ``ok`` (it ran), ``fail`` (it certainly did not, or
the server said so) or ``info`` (unknown: a timeout or a lost connection; the
request may have run). Faults are recorded in the same history under the
process ``"nemesis"`` so that every checker sees the fault windows.

The history is written as JSON Lines while the run goes, so a crashed run
still leaves everything up to its last flush on disk.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: tuple[str, ...] = ("invoke", "ok", "fail", "info")
NEMESIS = "nemesis"


def utc_iso(ts: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds, the one wall-clock format of every record."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Op:
    index: int
    time_ns: int  # time.monotonic_ns(): orders and measures; never jumps
    wall: str  # ISO 8601 UTC: for people and for lining up with other logs
    type: OpType
    process: int | str
    f: str
    value: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Op":
        if d.get("type") not in OP_TYPES:
            raise ValueError(f"op type must be one of {OP_TYPES}, got {d.get('type')!r}")
        return Op(
            index=int(d["index"]),
            time_ns=int(d["time_ns"]),
            wall=str(d["wall"]),
            type=d["type"],
            process=d["process"],
            f=str(d["f"]),
            value=dict(d.get("value") or {}),
            error=d.get("error"),
        )


class HistoryError(ValueError):
    """A history file that cannot be trusted; the message says where and why."""


class History:
    """Append-only recorder. Thread-safe: the workload and the nemesis share it.

    Writes go to ``path`` as JSON Lines and are flushed at most every
    ``flush_interval`` seconds (and on close), so the file trails the run by
    a bounded amount. Nothing is kept in memory but counters.
    """

    def __init__(self, path: str | os.PathLike[str], flush_interval: float = 0.5):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._next_index = 0
        self._last_flush = time.monotonic()
        self._flush_interval = flush_interval
        self.counts: dict[str, int] = {t: 0 for t in OP_TYPES}
        self.nemesis_counts: dict[str, int] = {t: 0 for t in OP_TYPES}

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
                time_ns=time.monotonic_ns(),
                wall=utc_iso(),
                type=type,
                process=process,
                f=f,
                value=value or {},
                error=error,
            )
            self._next_index += 1
            self._file.write(op.to_json() + "\n")
            bucket = self.nemesis_counts if process == NEMESIS else self.counts
            bucket[type] += 1
            now = time.monotonic()
            if now - self._last_flush >= self._flush_interval:
                self._file.flush()
                self._last_flush = now
            return op

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(
    path: str | os.PathLike[str], on_torn_tail: Callable[[str], None] | None = None
) -> Iterator[Op]:
    """Stream ops from a JSONL history, one line at a time (bounded memory).

    A malformed line raises HistoryError naming the file, the line and why.
    The one exception is a final line with no newline that does not parse: a
    write torn by a crash. It is not an op, but it is not silently dropped
    either: ``on_torn_tail`` receives it (without a callback it raises too).
    """
    p = Path(path)
    with p.open("r", encoding="utf-8", errors="strict") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                op = Op.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                torn = not line.endswith("\n") and fh.read(1) == ""
                if torn and on_torn_tail is not None:
                    on_torn_tail(f"{p}:{lineno}: torn final line dropped: {line[:120]!r}")
                    return
                raise HistoryError(
                    f"{p}:{lineno}: not a valid op ({e}): {line[:120]!r}. "
                    "The history file is damaged; ops before this line are intact."
                ) from e
            yield op
