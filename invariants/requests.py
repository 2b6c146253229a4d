"""One pass over a history that pairs each request's invoke with its
completion and says which phase of the run it fell in.

Phases come from the nemesis ops in the same history: a fault window runs
from an ``inject``/begin op to the matching ``heal``/end op; the
``after_s`` seconds after a heal are that heal's recovery window; the rest
is steady state. A request belongs to the phase in which it was *invoked*
(it met the cluster in that state), unless a fault began while it was in
flight: then it met that fault, and belongs to its window (a request cut by
a kill must not count as a steady-state error). Memory: the requests in
flight plus one small record per fault window.

A ``gap`` (a dead harness, resumed) ends the windows open at it, and the
requests it closed as ``info`` (value ``gap``: their outcome is unknown
because the harness died, not because the cluster failed) are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ordeal.history import MONITOR, NEMESIS, Op

STEADY = "steady"


@dataclass
class Window:
    label: str  # e.g. "process_kill@replica-1#1"
    kind: str
    target: str
    start_ns: int
    end_ns: int | None = None  # heal finished
    heal_value: dict[str, Any] = field(default_factory=dict)


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
    """Fault windows, built as the nemesis ops stream past."""

    def __init__(self, after_s: float):
        self.after_ns = round(after_s * 1e9)
        self.windows: list[Window] = []
        self._open: dict[str, Window] = {}
        self._counts: dict[str, int] = {}
        self._last_healed: Window | None = None

    def on_nemesis(self, op: Op) -> Window | None:
        """Track windows; returns the window this op opened, if any."""
        v = op.value
        key = f"{v.get('kind')}@{v.get('target')}"
        if op.f == "inject" and v.get("phase") == "begin":
            self._counts[key] = self._counts.get(key, 0) + 1
            w = Window(f"{key}#{self._counts[key]}", str(v.get("kind")), str(v.get("target")),
                       op.time_ns)
            self.windows.append(w)
            self._open[key] = w
            return w
        elif op.f == "heal" and v.get("phase") == "end" and key in self._open:
            w = self._open.pop(key)
            w.end_ns = op.time_ns
            w.heal_value = dict(v)
            self._last_healed = w
        return None

    def on_gap(self, op: Op) -> None:
        """The harness died and a new one resumed (``History.record_gap``):
        the new one healed every fault at its start, so the windows still
        open end here, and the gap itself is no recovery window."""
        for w in self._open.values():
            w.end_ns = op.time_ns
            w.heal_value = {"healed_by": "the resumed harness (gap)"}
        self._open.clear()
        w = self._last_healed  # its after-heal requests were cut by the death
        if w is not None and w.end_ns is not None and op.time_ns - w.end_ns <= self.after_ns:
            w.heal_value = {**w.heal_value, "after_heal_cut_by_gap": True}
        self._last_healed = None

    def phase_at(self, t_ns: int) -> tuple[str, str]:
        if self._open:
            return "fault", next(reversed(self._open.values())).label
        # Only the latest heal matters: O(1) per request however many faults
        # a 72-hour run has seen.
        w = self._last_healed
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
        if op.process == NEMESIS:
            opened = self.timeline.on_nemesis(op)
            if opened is not None:  # requests in flight now meet this fault
                for proc, (inv, _, _) in self._open.items():
                    self._open[proc] = (inv, "fault", opened.label)
        elif op.process == MONITOR:
            if op.f == "gap":
                self.timeline.on_gap(op)
            return None
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
