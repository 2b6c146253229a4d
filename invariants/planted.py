"""Planted corruption: faults that corrupt answers on purpose, judged as
*detection* instead of as ordinary violations.

``lsn_jump`` drops, duplicates or reorders SSE events of streams in flight
(through the fault proxy). It exists to prove that the stream checkers catch
such corruption, so in an endurance or nemesis run it always makes
``stream_wellformed``, ``usage_matches_tokens`` and ``canary_determinism``
False, and a healthy stack could never pass. ``with_planted`` splits the
judgement:

- ``ExcludingPlanted`` wraps each checker that a planted kind is meant to
  trip and hides from it the requests that met a planted fault window, so
  it judges the rest of the history as usual (real corruption outside the
  windows is still caught);
- ``PlantedDetected`` looks at exactly those hidden requests and demands
  that, in every planted window that streamed requests met, at least one of
  them was caught as corrupted by ``stream_problems`` or ``usage_problems``.

Exclusion rule. A request is excluded when its lifetime [invoke, completion]
overlaps a planted window (from the nemesis ``inject``/begin op to the
matching ``heal``/end op of the same kind and target, as
``ordeal.history.windows`` matches them): a planted window was open at its
invoke, or one began while it was in flight. That is known only at the
completion, so nothing is buffered: invokes always go to the inner checker
(usage needs each invoke's ``max_tokens``, determinism its canary prompt;
neither counts invokes, stream_wellformed ignores them) and an excluded
completion is replaced by a content-free ``info`` completion of the same
process (no stream, no usage, no text). All three inner checkers drop their
per-request state on any completion and judge nothing in a non-``ok`` op
without stream data (stream_continuity knows the stand-in, ``is_withdrawn``,
and neither judges nor counts it), so the request vanishes from their
verdict and their memory. Memory: one small record per request in flight, plus one per
planted window.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ordeal.history.ops import HARNESS, NEMESIS, Op
from ordeal.history.windows import CLOSED, OPENED, FaultWindows, Window

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker
from .stream_wellformed import stream_problems
from .usage import usage_problems

# Fault kinds that plant a corruption on purpose -> the checkers meant to
# catch it. Those checkers must not count the planted corruption as a defect
# of the stack (it is the harness's own doing); instead, planted_detected
# demands that they would have caught it.
PLANTED: dict[str, tuple[str, ...]] = {
    "lsn_jump": ("stream_wellformed", "usage_matches_tokens", "canary_determinism",
                 "stream_continuity"),
}
WITHDRAWN = "excluded: met planted fault"  # the error of a withdrawn completion


@dataclass(frozen=True)
class Met:
    """What a completed request met: the planted windows its lifetime
    overlapped (in order of begin), its invoke's max_tokens and time (None
    when its invoke was not seen)."""

    windows: tuple[Window, ...]
    max_tokens: int
    invoke_ns: int | None = None


def link_destination(target: str) -> str | None:
    """The replica behind a ``router-<replica>`` link, whose streams alone a
    toxic there can touch; None for a link every request crosses
    (``client-router``)."""
    return target[len("router-"):] if target.startswith("router-") else None


class PlantedWindows:
    """Planted fault windows as the nemesis ops stream past, and which of
    them each client request met. ``feed`` returns a ``Met`` for each client
    completion and None for every other op."""

    def __init__(self, kinds: Iterable[str]):
        self.kinds = frozenset(kinds)
        # Every fault window, fed the nemesis ops only (a gap leaves them open).
        self.faults = FaultWindows(gaps=False)
        self.planted: list[Window] = []  # planted windows, in order of begin
        self._open: dict[str, int] = {}  # kind@target -> index in planted, while open
        # In flight, per process: (planted windows begun by the invoke,
        # indexes of those open at the invoke, max_tokens, invoke time).
        self.inflight: dict[Any, tuple[int, tuple[int, ...], int, int]] = {}

    def feed(self, op: Op) -> Met | None:
        if op.process == NEMESIS:
            self._on_nemesis(op)
            return None
        if op.process in HARNESS:
            return None
        if op.type == "invoke":
            self.inflight[op.process] = (len(self.planted), tuple(self._open.values()),
                                         int(op.value.get("max_tokens") or 0), op.time_ns)
            return None
        entry = self.inflight.pop(op.process, None)
        if entry is None:  # no invoke seen: only its completion is known
            met = sorted(self._open.values())
            return Met(tuple(self.planted[i] for i in met), 0)
        begun, open_then, max_tokens, invoke_ns = entry
        met = sorted(set(open_then) | set(range(begun, len(self.planted))))
        return Met(tuple(self.planted[i] for i in met), max_tokens, invoke_ns)

    def exposed(self, w: Window, met: Met, node: Any) -> bool:
        """Was this request sure to meet ``w``'s toxics? Sent while they were
        in place (the proxy bites a response whose head arrives after a toxic
        is added, and leaves one already streaming alone: from its inject/end
        without error to its first heal/begin) and, on a router-replica link,
        served by that replica."""
        armed, disarmed = w.injected_ns, w.heal_begin_ns
        if met.invoke_ns is None or armed is None or met.invoke_ns < armed:
            return False
        if disarmed is not None and met.invoke_ns >= disarmed:
            return False
        dst = link_destination(w.target)
        return dst is None or node == dst

    def _on_nemesis(self, op: Op) -> None:
        change = self.faults.feed(op)
        if change is None or change.window.kind not in self.kinds:
            return
        w = change.window
        if change.what == OPENED:
            # A second inject of the same kind and target replaces the first
            # window, as in FaultWindows (which never heals the first).
            self._open[w.key] = len(self.planted)
            self.planted.append(w)
        elif change.what == CLOSED:
            del self._open[w.key]


def withdrawn(op: Op, met: Met) -> Op:
    """The content-free completion an inner checker gets instead of an
    excluded one: it closes the request (the inner drops what it kept from
    the invoke) and carries nothing to judge."""
    return Op(op.index, op.time_ns, op.wall, "info", op.process, op.f, {},
              f"{WITHDRAWN} {', '.join(w.label for w in met.windows)}")


def is_withdrawn(op: Op) -> bool:
    """``op`` is the stand-in ``withdrawn`` made for an excluded completion:
    nothing happened to count (stream_continuity must not count it lost)."""
    return op.type == "info" and not op.value and (op.error or "").startswith(WITHDRAWN)


class ExcludingPlanted(StreamingChecker):
    """``inner`` judging every request except those that met a window of a
    planted kind it is meant to catch (see the module's exclusion rule)."""

    def __init__(self, inner: StreamingChecker, kinds: Iterable[str] | None = None):
        self.inner = inner
        self.name = inner.name
        self.kinds = frozenset(kinds if kinds is not None else
                               (k for k, names in PLANTED.items() if inner.name in names))

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.windows = PlantedWindows(self.kinds)
        self.excluded = 0
        self.inner.start(ctx)

    def feed(self, op: Op) -> None:
        met = self.windows.feed(op)
        if met is not None and met.windows:
            self.excluded += 1
            op = withdrawn(op, met)
        self.inner.feed(op)

    def result(self) -> Result:
        r = self.inner.result()
        r.details = {**r.details, "excluded_planted": self.excluded}
        return r


class PlantedDetected(StreamingChecker):
    """Every planted window that streamed requests met was caught: at least
    one of those requests shows a stream problem (stream_wellformed's
    ``stream_problems``) or a billing problem (usage_matches_tokens's
    ``usage_problems``, ``ok`` ops only). Canary determinism is not used
    here: a canary's golden answer may not exist yet, or be planted itself.

    A window counts as missed only if a streamed request was *exposed* to it
    (``PlantedWindows.exposed``: sent after its toxics were in place and
    before their removal began, and on a router-replica link served by that
    replica). A request that merely overlapped the window may have streamed
    before the toxic or through another replica, and its clean answer proves
    nothing (seen at ``--time-scale 12``: 2-3 s windows whose overlapping
    streams had all begun before the inject).

    True if every window with an exposed stream had a detection (or no
    planted fault ran); False, naming the window, if one's corruption went
    unseen (the probe did not bite, or the checkers missed it); "unknown" if
    no streamed request was exposed to any planted window and none was
    caught."""

    name = "planted_detected"

    def __init__(self, kinds: Iterable[str] | None = None):
        self.kinds = frozenset(kinds if kinds is not None else PLANTED)

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.windows = PlantedWindows(self.kinds)
        self.streamed: dict[str, int] = {}  # window label -> streamed requests that met it
        self.exposed: dict[str, int] = {}  # ... of which sure to meet its toxics
        self.caught: dict[str, dict[str, Any]] = {}  # window label -> first detection
        self.n_caught: dict[str, int] = {}
        self.excluded = 0

    def feed(self, op: Op) -> None:
        met = self.windows.feed(op)
        if met is None or not met.windows:
            return
        self.excluded += 1
        stream = op.value.get("stream")
        if not isinstance(stream, dict):
            return
        problems = stream_problems(op, stream)
        if op.type == "ok":
            problems += usage_problems(op.value, met.max_tokens)[1]
        for w in met.windows:
            self.streamed[w.label] = self.streamed.get(w.label, 0) + 1
            if self.windows.exposed(w, met, op.value.get("node")):
                self.exposed[w.label] = self.exposed.get(w.label, 0) + 1
            if problems:
                self.n_caught[w.label] = self.n_caught.get(w.label, 0) + 1
                self.caught.setdefault(w.label, {"index": op.index, "type": op.type,
                                                 "wall": op.wall, "problems": problems[:3]})

    def result(self) -> Result:
        planted = self.windows.planted
        per_window: dict[str, dict[str, Any]] = {}
        missed: list[dict[str, Any]] = []
        for w in planted:
            streamed = self.streamed.get(w.label, 0)
            exposed = self.exposed.get(w.label, 0)
            entry: dict[str, Any] = {"kind": w.kind, "target": w.target,
                                     "begin_wall": w.start_wall,
                                     "healed": w.end_ns is not None, "streamed": streamed,
                                     "exposed": exposed,
                                     "caught": self.n_caught.get(w.label, 0)}
            if w.label in self.caught:
                entry["first_caught"] = self.caught[w.label]
            elif streamed and not exposed:
                entry["why_not_judged"] = ("no streamed request was sent while its toxics "
                                           "were in place" + (
                                               f" and served by {link_destination(w.target)}"
                                               if link_destination(w.target) else ""))
            per_window[w.label] = entry
            if exposed and w.label not in self.caught:
                missed.append({"window": w.label, "kind": w.kind, "target": w.target,
                               "begin_wall": entry["begin_wall"], "streamed": streamed,
                               "exposed": exposed,
                               "problem": f"planted {w.kind} corruption went undetected: "
                                          f"{exposed} streamed request(s) were sent while its "
                                          "toxics were in place and none showed a stream or "
                                          "usage problem"})
        details: dict[str, Any] = {"planted_windows": len(planted), "excluded": self.excluded,
                                   "windows": per_window}
        if not planted:
            return Result(self.name, True, {**details, "why": "no planted fault in this run"})
        if missed:
            return Result(self.name, False, {**details, "undetected": len(missed)},
                          missed[:MAX_COUNTEREXAMPLES])
        if not any(self.exposed.values()) and not self.caught:
            return Result(self.name, "unknown",
                          {**details, "why": "no streamed request was sent while a planted "
                                             "fault's toxics were in place"})
        return Result(self.name, True, details)


def with_planted(checkers: Sequence[StreamingChecker]) -> list[StreamingChecker]:
    """``checkers`` with each one a planted kind is meant to trip wrapped in
    ``ExcludingPlanted``, and one ``PlantedDetected`` appended; the others are
    unchanged. Idempotent."""
    meant = {name for names in PLANTED.values() for name in names}
    out: list[StreamingChecker] = [
        ExcludingPlanted(c) if c.name in meant and not isinstance(c, ExcludingPlanted) else c
        for c in checkers]
    if not any(isinstance(c, PlantedDetected) for c in out):
        out.append(PlantedDetected())
    return out
