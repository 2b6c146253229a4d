"""One pass over a history that pairs each request's invoke with its
completion and says which phase of the run it fell in.

Phases come from the fault windows of the same history
(``ordeal.history.windows``: from an ``inject``/begin op to the matching
``heal``/end op); the ``after_s`` seconds after a heal are that heal's
recovery window; the rest is steady state. A request belongs to the phase
in which it was *invoked* (it met the cluster in that state), unless a fault
began while it was in flight: then it met that fault, and belongs to its
window (a request cut by a kill must not count as a steady-state error). Memory: the requests in
flight plus one small record per fault window.

The warm-up (``CheckerSettings.warmup_s``, 0 by default: none): the run from
its start until ``warmup_s`` seconds after the first request's invoke (the
load's start; after a ``gap``, the resumed load's first request, on the
cluster the resumed harness started) is phase ``warmup``, not ``steady``. A
fault window or an after-heal window inside it keeps its own phase. Only
the steady-state judgements leave the warm-up out (they compare against
``steady``); checkers that judge every request (no loss, streams, usage,
duplicates) do not use phases and see it as any other.

A ``gap`` (a dead harness, resumed) ends the windows open at it, and the
requests it closed as ``info`` (value ``gap``: their outcome is unknown
because the harness died, not because the cluster failed) are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from ordeal.history.ops import HARNESS, MONITOR, Op
from ordeal.history.windows import OPENED, FaultWindows, Window

STEADY = "steady"
WARMUP = "warmup"


@dataclass(frozen=True)
class Request:
    invoke: Op
    done: Op
    phase: str  # "steady", "warmup", "fault" or "after_heal"
    window: str  # STEADY, WARMUP or the fault window's label

    @property
    def latency(self) -> dict[str, Any]:
        return self.done.value


class Warmup:
    """The warm-up of a run (module docstring): fed every op in history
    order (it needs the clients' invokes and the ``gap`` ops), it says
    whether a moment falls in it. ``warmup_s`` 0 (or less): no warm-up."""

    def __init__(self, warmup_s: float = 0.0):
        self.warmup_ns = max(0, round(warmup_s * 1e9))
        self.load_start_ns: int | None = None  # the first invoke (since the last gap)

    def feed(self, op: Op) -> None:
        if op.process == MONITOR and op.f == "gap":
            self.load_start_ns = None  # the resumed harness's load warms up again
        elif (self.load_start_ns is None and op.type == "invoke"
              and op.process not in HARNESS):
            self.load_start_ns = op.time_ns

    @property
    def end_ns(self) -> int | None:
        """When the current warm-up ends (None: the load has not started)."""
        if not self.warmup_ns or self.load_start_ns is None:
            return None
        return self.load_start_ns + self.warmup_ns

    def covers(self, t_ns: int) -> bool:
        """``t_ns`` (not before the last op fed) is in the warm-up."""
        if not self.warmup_ns:
            return False
        return self.load_start_ns is None or t_ns < self.load_start_ns + self.warmup_ns


class Timeline:
    """The phase of the run at each moment, from the fault windows
    (``ordeal.history.windows``) and the warm-up (``Warmup``) as the ops
    stream past. Feed it the harness ops and the clients' invokes."""

    def __init__(self, after_s: float, warmup_s: float = 0.0):
        self.after_ns = round(after_s * 1e9)
        self.faults = FaultWindows()
        self.warmup = Warmup(warmup_s)
        self.cut_by_gap: set[str] = set()  # labels of windows whose after-heal a gap cut

    @property
    def windows(self) -> list[Window]:
        return self.faults.windows

    def feed(self, op: Op) -> Window | None:
        """Track windows (nemesis ops, and the gap that ends those open at
        a harness's death: the resumed one healed them, and the gap itself
        is no recovery window) and the load's start (a client's invoke);
        returns the window this op opened, if any."""
        self.warmup.feed(op)
        if op.process not in HARNESS:
            return None
        if op.process == MONITOR and op.f == "gap":
            w = self.faults.last_healed  # its after-heal requests were cut by the death
            if w is not None and w.end_ns is not None and op.time_ns - w.end_ns <= self.after_ns:
                self.cut_by_gap.add(w.label)
        change = self.faults.feed(op)
        return change.window if change is not None and change.what == OPENED else None

    def phase_at(self, t_ns: int) -> tuple[str, str]:
        if self.faults.open:
            return "fault", next(reversed(self.faults.open.values())).label
        # Only the latest heal matters: O(1) per request however many faults
        # a 72-hour run has seen.
        w = self.faults.last_healed
        if w is not None and w.end_ns is not None and 0 <= t_ns - w.end_ns <= self.after_ns:
            return "after_heal", w.label
        if self.warmup.covers(t_ns):
            return WARMUP, WARMUP
        return STEADY, STEADY


class RequestPairer:
    """Feed ops; get back each completed request once, with its phase.
    Unpaired ops are no_silent_loss's business and are skipped here."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self._open: dict[Any, tuple[Op, str, str]] = {}

    def feed(self, op: Op) -> Request | None:
        if op.process in HARNESS:
            opened = self.timeline.feed(op)
            if opened is not None:  # requests in flight now meet this fault
                for proc, (inv, _, _) in self._open.items():
                    self._open[proc] = (inv, "fault", opened.label)
        elif op.type == "invoke":
            self.timeline.feed(op)  # the first one starts the load (and its warm-up)
            self._open[op.process] = (op, *self.timeline.phase_at(op.time_ns))
        else:
            entry = self._open.pop(op.process, None)
            if entry is not None and not op.value.get("gap"):
                return Request(entry[0], op, entry[1], entry[2])
        return None


def paired_requests(history: Iterable[Op], timeline: Timeline) -> Iterator[Request]:
    pairer = RequestPairer(timeline)
    for op in history:
        req = pairer.feed(op)
        if req is not None:
            yield req
