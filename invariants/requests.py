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


@dataclass(frozen=True)
class Request:
    invoke: Op
    done: Op
    phase: str  # "steady", "fault" or "after_heal"
    window: str  # STEADY or the fault window's label

    @property
    def latency(self) -> dict[str, Any]:
        return self.done.value


class Timeline:
    """The phase of the run at each moment, from the fault windows
    (``ordeal.history.windows``) as the ops stream past."""

    def __init__(self, after_s: float):
        self.after_ns = round(after_s * 1e9)
        self.faults = FaultWindows()
        self.cut_by_gap: set[str] = set()  # labels of windows whose after-heal a gap cut

    @property
    def windows(self) -> list[Window]:
        return self.faults.windows

    def feed(self, op: Op) -> Window | None:
        """Track windows (nemesis ops, and the gap that ends those open at
        a harness's death: the resumed one healed them, and the gap itself
        is no recovery window); returns the window this op opened, if any."""
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
