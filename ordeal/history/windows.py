"""Fault windows, from the nemesis ops of a history: the one reading of
them that every checker, report and run uses.

The nemesis records each fault action as two ops of the process
``nemesis`` (faults/nemesis.py): ``inject`` then ``heal``, each a ``begin``
op before the action and an ``end`` op after it (with the error if it
failed); the ``end`` values carry the fault's result (its ``fault_id`` in
the ledger, what a heal restarted...). A step that could not be built is a
single ``inject`` op of phase ``refused``. Every op names the fault's
``kind`` and ``target``.

A window runs from an inject/begin to the heal/end of the same kind and
target (its key, ``kind@target``). A second inject/begin of a key while a
window of it is open opens a new window that takes the key over; the first
is never healed. A ``gap`` (a dead harness, resumed: its clean-up healed
every fault) ends the windows open at it, unless told otherwise.

``FaultWindows`` is fed op by op (one pass, in history order; memory: one
small record per window) and says what each op changed; ``fault_windows``
reads a whole history the same way.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from .ops import MONITOR, NEMESIS, Op

# What an op did to a window (``Change.what``).
OPENED = "opened"  # inject/begin: a new window
INJECTED = "injected"  # inject/end without an error: the fault is in place
INJECT_FAILED = "inject_failed"  # inject/end with an error, or inject/refused
HEALING = "healing"  # heal/begin: its removal began
CLOSED = "closed"  # heal/end: the window is over


@dataclass
class Window:
    label: str  # its key and ordinal among that key's windows: "process_kill@replica-1#1"
    kind: str
    target: str
    start_ns: int  # inject/begin
    start_wall: str
    fault_id: str | None = None  # the fault's id in the ledger (from an end op's value)
    injected_ns: int | None = None  # inject/end without an error (the latest)
    injected_wall: str | None = None
    inject_error: str | None = None  # inject/end's error, or "refused"
    heal_begin_ns: int | None = None  # the first heal/begin
    end_ns: int | None = None  # heal/end, or the gap that ended it; None: still open
    end_wall: str | None = None
    heal_value: dict[str, Any] = field(default_factory=dict)  # heal/end's value
    heal_error: str | None = None  # heal/end's error
    ended_by_gap: bool = False  # the harness died in it; the resumed one healed it

    @property
    def key(self) -> str:
        return f"{self.kind}@{self.target}"


def label_parts(label: str) -> tuple[str, str]:
    """(kind, target) of a window label ``kind@target#n`` (``Window.label``)."""
    kind, _, rest = label.partition("@")
    return kind, rest.rsplit("#", 1)[0]


class Change(NamedTuple):
    what: str  # OPENED, INJECTED, INJECT_FAILED, HEALING or CLOSED
    window: Window


class FaultWindows:
    """Fault windows as the ops stream past: ``feed`` every op in history
    order; it returns the Change a nemesis op made (None for other ops, and
    for an op of a key with no open window).

    ``windows``: every window in order of begin (the first ``keep`` of them
    when ``keep`` is set; ``dropped`` counts the rest, which are still
    tracked while open). ``open``: key -> the window open on it, the keys in
    the order they were first opened. ``last_healed``: the window of the
    latest heal/end (None after a gap). ``gaps=False`` leaves windows open
    across a gap."""

    def __init__(self, gaps: bool = True, keep: int | None = None):
        self.gaps = gaps
        self.keep = keep
        self.windows: list[Window] = []
        self.dropped = 0
        self.open: dict[str, Window] = {}
        self.last_healed: Window | None = None
        self._counts: dict[str, int] = {}

    @property
    def healing(self) -> bool:
        """An open window's heal has begun and not ended."""
        return any(w.heal_begin_ns is not None for w in self.open.values())

    def feed(self, op: Op) -> Change | None:
        if op.process == MONITOR:
            if op.f == "gap" and self.gaps:
                self._gap(op)
            return None
        if op.process != NEMESIS:
            return None
        v = op.value
        key = f"{v.get('kind')}@{v.get('target')}"
        phase = v.get("phase")
        if op.f == "inject" and phase == "begin":
            n = self._counts[key] = self._counts.get(key, 0) + 1
            w = Window(f"{key}#{n}", str(v.get("kind")), str(v.get("target")), op.time_ns,
                       op.wall)
            if self.keep is None or len(self.windows) < self.keep:
                self.windows.append(w)
            else:
                self.dropped += 1
            self.open[key] = w
            return Change(OPENED, w)
        w = self.open.get(key)
        if w is None or op.f not in ("inject", "heal"):
            return None
        if w.fault_id is None and phase == "end" and isinstance(v.get("fault_id"), str):
            w.fault_id = v["fault_id"]
        if op.f == "inject":
            if phase == "end" and not op.error:
                w.injected_ns, w.injected_wall = op.time_ns, op.wall
                return Change(INJECTED, w)
            if phase in ("end", "refused"):
                w.inject_error = op.error or "refused"
                return Change(INJECT_FAILED, w)
            return None
        if phase == "begin":
            if w.heal_begin_ns is None:
                w.heal_begin_ns = op.time_ns
            return Change(HEALING, w)
        if phase == "end":
            del self.open[key]
            w.end_ns, w.end_wall = op.time_ns, op.wall
            w.heal_value, w.heal_error = dict(v), op.error
            self.last_healed = w
            return Change(CLOSED, w)
        return None

    def _gap(self, op: Op) -> None:
        for w in self.open.values():
            w.end_ns, w.end_wall, w.ended_by_gap = op.time_ns, op.wall, True
        self.open.clear()
        self.last_healed = None  # the gap itself is no recovery window


class WindowNear:
    """The fault window an observation read late belongs to: the latest
    opened that is still open, else the latest closed at most ``lag_s``
    before. The replicas' served journals reach the history only when the
    monitor reads them (every few seconds), so what a replica did inside a
    window may be read just after it closed. ``feed`` every op in history
    order (it returns FaultWindows.feed's Change); memory: the windows
    closed within the lag."""

    def __init__(self, lag_s: float):
        self.faults = FaultWindows(keep=0)
        self.lag_ns = int(lag_s * 1e9)
        self.closed: deque[tuple[str, int]] = deque()  # (label, end ns), the recent ones

    def feed(self, op: Op) -> Change | None:
        change = self.faults.feed(op)
        if change is not None and change.what == CLOSED:
            self.closed.append((change.window.label, op.time_ns))
        return change

    def at(self, t_ns: int) -> str | None:
        while self.closed and t_ns - self.closed[0][1] > self.lag_ns:
            self.closed.popleft()
        if self.faults.open:
            return list(self.faults.open.values())[-1].label
        return self.closed[-1][0] if self.closed else None


def fault_windows(ops: Iterable[Op], gaps: bool = True) -> list[Window]:
    """Every fault window of a history (``FaultWindows`` over all its ops)."""
    tracker = FaultWindows(gaps=gaps)
    for op in ops:
        tracker.feed(op)
    return tracker.windows
