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
NEMESIS = "nemesis"  # fault actions
MONITOR = "monitor"  # samples of the nodes' health and metrics
HARNESS = frozenset({NEMESIS, MONITOR})  # processes that are not clients


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
            if process == NEMESIS:
                self.nemesis_counts[type] += 1
            elif process != MONITOR:
                self.counts[type] += 1
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


def _loads() -> Callable[[str | bytes], Any]:
    try:  # 3-4x faster on long histories; a dependency of vLLM, optional here
        import orjson

        return orjson.loads
    except ImportError:
        return json.loads


REQUIRED = ("index", "time_ns", "wall", "type", "process", "f")


def read_history(
    path: str | os.PathLike[str], on_error: Callable[[str], None] | None = None
) -> Iterator[Op]:
    """Stream ops from a JSONL history, one line at a time (bounded memory).

    A line that is not a valid op (corrupt, torn by a crash, or written in
    an older format) is never silently dropped: with ``on_error`` it is
    reported there, naming the file, line and reason, and reading goes on
    so the rest of the history is still checked; without ``on_error`` it
    raises HistoryError.
    """
    p = Path(path)
    loads = _loads()
    with p.open("rb") as fh:
        lineno = 0
        for raw in fh:
            lineno += 1
            if not raw.strip():
                continue
            try:
                d = loads(raw)
                if not isinstance(d, dict):
                    raise ValueError("not a JSON object")
                missing = [k for k in REQUIRED if k not in d]
                if missing:
                    raise ValueError(f"missing {missing}: written by an older or other format?")
                op = Op.from_dict(d)
            except (ValueError, KeyError, TypeError) as e:
                torn = not raw.endswith(b"\n")
                what = "torn final line (a crash mid-write)" if torn else "not a valid op"
                msg = f"{p}:{lineno}: {what} ({e}): {raw[:120]!r}"
                if on_error is None:
                    raise HistoryError(msg + ". Ops on other lines are intact.") from e
                on_error(msg)
                continue
            yield op
