"""Failover: when a replica stops answering, the router must stop sending it
new requests soon, and take it back after the heal.

For every fault window on a replica that stops it answering (the kinds that
declare ``stops_target``, ordeal.kinds: kill, pause, partition, and Ray's
node faults; the target is the replica, or
a ``router-replica-N`` link of the fault proxy), from the evidence the
history has, the node each answer names (vLLM: ``x-ordeal-node``; Triton:
the model's ``node`` output or HAProxy's ``x-ordeal-node``):

- *sent to the failed replica*: a request invoked after the window began
  and before its heal began that the failed replica answered (a paused or
  cut replica answers once it is back) or that ended ``fail``/``info``
  without any node's answer (a killed replica answers nothing; the router
  passes its refusal or timeout on). A request that another replica
  answered was not sent there. Requests already in flight when the fault
  began are not counted: they were routed before it.
- *ejection time*: from the window's start to the invoke of the last such
  request (0 when none was sent there). Each request sent there after
  ``failover_bound_s`` (``[slo]`` in the SLO file) is a counterexample: the
  router kept sending to a replica that had stopped answering for longer
  than a router with working health checks needs.
- *re-admission time*: from the heal's end to the invoke of the first
  request the healed replica answered ``ok``. A replica never taken back
  while the load ran on for more than ``readmission_bound_s`` after the heal
  is a counterexample; with less load after it the time is ``None`` and not
  judged.

A fault on the only replica that answered in the run (one replica, or the
others never answered) is not judged: there was nowhere to fail over to
(``windows_on_the_only_replica``; its figures are still shown).

Figures per window (the latest ``MAX_WINDOW_ROWS`` shown, all of them in
the maxima). No window of that kind: ``unknown`` is not claimed; the
checker is valid with ``windows: 0`` (nothing to fail over), as the report
shows. A request without a node in its answer that ended ``ok`` cannot be
placed and is counted in ``unplaced``; when no answer of the run named a
replica and a window needed one, the result is ``unknown``.

Memory: the invoke time of each request in flight, one row per shown
window, one ``violations_by_window`` and one ``measured_by_window`` entry
(its ``ejection_s``, ``sent_after_bound``, ``not_readmitted``: what a known
finding's bounds are held against) per window with violations (shown or
not: a known-findings file matches them all), at most
``MAX_COUNTEREXAMPLES`` counterexamples.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from typing import Any

from ordeal import kinds
from ordeal.history.ops import HARNESS, Op
from ordeal.history.windows import CLOSED, HEALING, INJECT_FAILED, OPENED, FaultWindows

from .base import (
    MAX_COUNTEREXAMPLES,
    MAX_WINDOW_ROWS,
    Result,
    RunContext,
    StreamingChecker,
    op_brief,
)
from .planted import is_withdrawn

NO_NODE_NAMED = ("faults stopped replicas, but no answer named the replica that served it: "
                 "where requests went cannot be seen")
_LINK = re.compile(r"^router-(replica-\d+)(-grpc)?$")


def partial_attribution(ctx: RunContext, alone: int, unplaced_in_windows: int) -> str | None:
    """Why a pass would rest on answers the deployment's own header did not
    place (``ctx.provided`` node_attribution: an external target's
    ``replica_header``), or None. There, an answer whose value no replica
    claims is no node: a window looks "alone" when the file names only
    some replicas, and a victim that came back under another name answers
    unplaced. Ordeal's own replicas always name themselves."""
    if "node_attribution" not in ctx.provided:
        return None
    if alone:
        return (f"{alone} window(s) on a replica no other named replica answered beside: the "
                "deployment's replica header may name replicas the target file does not list")
    if unplaced_in_windows:
        return (f"{unplaced_in_windows} answer(s) during a fault window named no listed "
                "replica: whether the stopped one served them cannot be seen (add their "
                "header values to served_as)")
    return None


def victim_of(target: str, replicas: tuple[str, ...] = ()) -> str | None:
    """The replica a fault on ``target`` stops: itself, or the far end of a
    router->replica link; None for any other target (the router, a client
    link: no failover to judge). ``replicas``: the cluster's replica names
    (``RunContext.replicas``), so that a replica an external target file
    calls ``pod-a`` is a victim too; Ordeal's own are ``replica-N``."""
    if target in replicas or re.fullmatch(r"replica-\d+", target):
        return target
    for name in replicas:
        if target in (f"router-{name}", f"router-{name}-grpc"):
            return name
    m = _LINK.match(target)
    return m.group(1) if m else None


class _Row:
    __slots__ = ("label", "kind", "victim", "start_ns", "heal_ns", "end_ns", "inject_failed",
                 "sent", "late", "last_sent_ns", "readmitted_ns", "label_wall", "examples")

    def __init__(self, label: str, kind: str, victim: str, start_ns: int, wall: str):
        self.label, self.kind, self.victim = label, kind, victim
        self.start_ns, self.label_wall = start_ns, wall
        self.heal_ns: int | None = None  # heal/begin: from here on it may answer again
        self.end_ns: int | None = None  # heal/end
        self.inject_failed = False
        self.sent = self.late = 0
        self.last_sent_ns: int | None = None
        self.readmitted_ns: int | None = None
        self.examples: list[dict[str, Any]] = []  # its late requests (the first few)

    def covers(self, t: int) -> bool:
        """Invoked while the replica was down (after the start, before the heal)."""
        return t >= self.start_ns and (self.heal_ns is None or t < self.heal_ns)


class Failover(StreamingChecker):
    name = "failover"
    needs = ("node_attribution",)
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.bound_ns = int(ctx.settings.slo.failover_bound_s * 1e9)
        self.readmit_ns = int(ctx.settings.slo.readmission_bound_s * 1e9)
        self.faults = FaultWindows(keep=0)
        self.stops = kinds.stopping_kinds()  # raises if no kind is loaded: never judge none
        self.invoked: dict[Any, int] = {}
        self.rows: OrderedDict[str, _Row] = OrderedDict()
        self.dropped = 0
        self.windows = 0
        self.max_ejection_ns = 0
        self.max_readmission_ns: int | None = None
        self.not_readmitted = 0
        self.unplaced = 0
        self.unplaced_in_windows = 0  # of those, sent while a replica was down
        self.last_invoke_ns = 0
        self.examples: list[dict[str, Any]] = []
        self.late_total = 0
        # Violations per window, of every window (shown or not): a known-findings
        # file matches by window, and on a long run most windows are no longer shown.
        self.by_window: dict[str, int] = {}
        # The figures of each window with violations, for a known finding's
        # bounds (``measured_by_window``): as many entries as by_window.
        self.measured: dict[str, dict[str, Any]] = {}
        self.nodes: set[str] = set()  # every replica seen answering
        self.alone = 0  # windows on the only replica: nowhere to fail over to

    def _on_harness(self, op: Op) -> None:
        change = self.faults.feed(op)
        if change is None:
            return
        w = change.window
        victim = victim_of(w.target, self.ctx.replicas)
        if w.kind not in self.stops or victim is None:
            return
        if change.what == OPENED:
            self.windows += 1
            self.rows[w.label] = _Row(w.label, w.kind, victim, w.start_ns, w.start_wall)
            if len(self.rows) > MAX_WINDOW_ROWS:
                self._retire(self.rows.popitem(last=False)[1])
                self.dropped += 1
            return
        row = self.rows.get(w.label)
        if row is None:
            return
        if change.what == INJECT_FAILED:
            row.inject_failed = True
        elif change.what == HEALING and row.heal_ns is None:
            row.heal_ns = op.time_ns
        elif change.what == CLOSED:
            row.end_ns = op.time_ns
            if row.heal_ns is None:
                row.heal_ns = op.time_ns

    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            self._on_harness(op)
            return
        if op.type == "invoke":
            self.invoked[op.process] = op.time_ns
            self.last_invoke_ns = max(self.last_invoke_ns, op.time_ns)
            return
        t = self.invoked.pop(op.process, None)
        if t is None or is_withdrawn(op) or op.value.get("gap"):
            return
        node = op.value.get("node")
        if op.type == "ok" and node is not None:
            self.nodes.add(node)
        if op.type == "ok" and node is None:
            self.unplaced += 1
            if any(row.covers(t) for row in self.rows.values()):
                self.unplaced_in_windows += 1
            return
        for row in self.rows.values():
            if row.inject_failed:
                continue
            if row.covers(t) and (node == row.victim or (op.type != "ok" and node is None)):
                self._sent(row, op, t, node)
            elif (op.type == "ok" and node == row.victim and row.end_ns is not None
                  and t >= row.end_ns and row.readmitted_ns is None):
                row.readmitted_ns = t

    def _sent(self, row: _Row, op: Op, t: int, node: str | None) -> None:
        row.sent += 1
        row.last_sent_ns = t if row.last_sent_ns is None else max(row.last_sent_ns, t)
        after = t - row.start_ns
        if after > self.bound_ns:
            row.late += 1
            if len(row.examples) < MAX_COUNTEREXAMPLES:
                row.examples.append({
                    "problem": f"sent to {row.victim} {after / 1e9:.1f}s after "
                               f"{row.kind} began (bound {self.bound_ns / 1e9:g}s)",
                    "window": row.label, "answered_by": node, **op_brief(op)})

    def _retire(self, row: _Row) -> dict[str, Any]:
        """A window's figures (and its share of the maxima and the
        counterexamples). A fault on the only replica that ever answered
        is not judged: there was nowhere else to send."""
        alone = not (self.nodes - {row.victim})
        if alone:
            self.alone += 1
        else:
            self.late_total += row.late
            self.examples.extend(row.examples[:MAX_COUNTEREXAMPLES - len(self.examples)])
        ejection = (row.last_sent_ns - row.start_ns) if row.last_sent_ns is not None else 0
        self.max_ejection_ns = max(self.max_ejection_ns, ejection)
        readmission = None
        if row.readmitted_ns is not None and row.end_ns is not None:
            readmission = row.readmitted_ns - row.end_ns
            self.max_readmission_ns = max(self.max_readmission_ns or 0, readmission)
        never = (not alone and row.end_ns is not None and row.readmitted_ns is None
                 and self.last_invoke_ns - row.end_ns > self.readmit_ns)
        if never:
            self.not_readmitted += 1
            if len(self.examples) < MAX_COUNTEREXAMPLES:
                self.examples.append({
                    "problem": f"{row.victim} was not taken back: no request it answered in "
                               f"the {(self.last_invoke_ns - row.end_ns) / 1e9:.0f}s of load "
                               f"after {row.kind} healed (bound {self.readmit_ns / 1e9:g}s)",
                    "window": row.label})
        violations = (0 if alone else row.late) + int(never)
        if violations:
            self.by_window[row.label] = violations
            self.measured[row.label] = {"ejection_s": round(ejection / 1e9, 3),
                                        "sent_after_bound": row.late, "not_readmitted": never}
        return {"kind": row.kind, "replica": row.victim, "begin_wall": row.label_wall,
                "inject_failed": row.inject_failed, "sent_while_down": row.sent,
                "sent_after_bound": 0 if alone else row.late, "no_other_replica": alone,
                "ejection_s": round(ejection / 1e9, 3),
                "readmission_s": None if readmission is None else round(readmission / 1e9, 3),
                "not_readmitted": never}

    def result(self) -> Result:
        # Judge copies of the running figures: result() may be called mid-run
        # (the endurance judge's interim files), and _retire adds to them.
        names = ("late_total", "not_readmitted", "alone", "max_ejection_ns",
                 "max_readmission_ns", "examples", "by_window", "measured")
        saved = {n: copy.copy(getattr(self, n)) for n in names}
        try:
            return self._result()
        finally:
            for n, v in saved.items():
                setattr(self, n, v)

    def _result(self) -> Result:
        shown = {label: self._retire(row) for label, row in self.rows.items()}
        # Every violation by its window, for a known-findings file to match
        # (the counterexamples are cut at MAX_COUNTEREXAMPLES), the windows no
        # longer shown included.
        by_window = dict(self.by_window)
        details: dict[str, Any] = {
            "windows": self.windows,
            "max_ejection_s": round(self.max_ejection_ns / 1e9, 3),
            "max_readmission_s": (None if self.max_readmission_ns is None
                                  else round(self.max_readmission_ns / 1e9, 3)),
            "sent_after_bound": self.late_total,
            "not_readmitted": self.not_readmitted,
            "failover_bound_s": self.bound_ns / 1e9,
            "readmission_bound_s": self.readmit_ns / 1e9,
            "unplaced": self.unplaced,
            "windows_on_the_only_replica": self.alone,
            "violations": self.late_total + self.not_readmitted,
            "violations_by_window": by_window,
            "measured_by_window": dict(self.measured),
            "windows_shown": shown,
            "windows_not_shown": self.dropped,
        }
        bad = self.late_total or self.not_readmitted
        if not bad and self.windows and not self.nodes:
            # No answer named a replica (a replica_header whose values no
            # replica claims, say): every window would look like one on the
            # only replica, and a pass would rest on nothing.
            details["why"] = NO_NODE_NAMED
            return Result(self.name, "unknown", details, [])
        partial = partial_attribution(self.ctx, self.alone, self.unplaced_in_windows)
        if not bad and partial:
            details["why"] = partial
            return Result(self.name, "unknown", details, [])
        return Result(self.name, not bad, details, list(self.examples))
