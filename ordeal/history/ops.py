"""The vocabulary of a history: the op, its types, the processes of the
harness, and the one wall-clock format of every record."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: tuple[str, ...] = ("invoke", "ok", "fail", "info")
NEMESIS = "nemesis"  # fault actions
MONITOR = "monitor"  # samples of the nodes' health and metrics; a resume's gap
HARNESS = frozenset({NEMESIS, MONITOR})  # processes that are not clients


def utc_iso(ts: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds, the one wall-clock format of every record."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(wall: str | None) -> float | None:
    """The epoch seconds of a ``utc_iso`` time; None if it is not one."""
    try:
        return datetime.fromisoformat(str(wall).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
        # A plain dict, not dataclasses.asdict: asdict deep-copies the value
        # (every chunk of a stream), 12% of the load generator's event loop
        # at 400 req/s (py-spy, bench/README.md). Same keys, same order; a
        # value holding a dataclass still goes through asdict.
        d = {"index": self.index, "time_ns": self.time_ns, "wall": self.wall,
             "type": self.type, "process": self.process, "f": self.f,
             "value": self.value, "error": self.error}
        try:
            return json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        except TypeError:
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


def stream_texts(stream: Any) -> list[str]:
    """Each token event's text from a history's ``stream`` value: the
    ``texts`` column, or the per-event dicts (``chunks``) that histories
    written before 2026-12-05 hold."""
    if not isinstance(stream, dict):
        return []
    texts = stream.get("texts")
    if isinstance(texts, list):
        return [t if isinstance(t, str) else "" for t in texts]
    chunks = stream.get("chunks")
    if isinstance(chunks, list):
        return [str(c.get("text") or "") if isinstance(c, dict) else "" for c in chunks]
    return []
