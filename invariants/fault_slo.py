"""Fault-window SLO: while one replica is down and others are left, the
requests sent after the failover bound must still meet their targets.

Latency is judged in steady state (invariants.slo) and ``availability``
counts a request that waited out a 10 s pause as available; so a run in
which a third of the traffic stalled for the length of every fault could
pass. This checker judges that traffic. For every fault window that stops a
replica answering (``stops_target`` kinds, ordeal.kinds, on a replica or a
``router-replica-N`` link, ``failover.victim_of``), the requests *invoked* after
``failover_bound_s`` (``[slo]``) from the window's start and before its heal
began are the window's judged requests: by then a router with working
health checks sends everything to the replicas left. Each meets the
``[fault_slo]`` targets (FaultSLOTargets: TTFT, TPOT, E2E per request, as
``vllm bench serve``'s ``--goodput``) or not; a window whose goodput (the
share that met every target, ``ok`` ones only) is below ``min_goodput`` is a
violation, with its requests that missed as examples. Figures per window:
requests, ok, goodput, TTFT p50/p99 of the judged requests.

Not judged, and said: a window on the only replica that answered in the run
(nowhere to fail over to), a window whose inject failed, a window with fewer
than ``min_requests`` judged requests (shown with its figures). The requests
sent to the failed replica after the bound are failover's counterexamples
too; this checker judges what they cost the users.

Memory: one invoke record per request in flight, one row per shown window
(``MAX_WINDOW_ROWS``; an older window is judged when it leaves the table and
then counted in the totals and, when it missed, in ``violations_by_window``
and ``measured_by_window`` (its ``goodput``, ``requests``, ``missed`` and
``last_missed_s``: how far into the window the last request that missed
was sent): one entry per missed window, so a known-findings file can cover
every one and hold it against its bounds),
at most ``MAX_COUNTEREXAMPLES`` examples.
"""

from __future__ import annotations

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
from .failover import NO_NODE_NAMED, partial_attribution, victim_of
from .histogram import LatencyHistogram
from .planted import is_withdrawn
from .settings import FaultSLOTargets
from .slo import DUE_METRICS

TARGETS = ("ttft_ms", "tpot_ms", "e2e_ms")


def due_figures(value: dict[str, Any], lag_ms: float) -> dict[str, Any]:
    """An answer's TARGETS figures, TTFT and E2E from the due time (the
    client's figure plus the invoke's schedule lag, as ``slo.figure``)."""
    return {m: value[m] + (lag_ms if m in DUE_METRICS else 0.0) for m in TARGETS
            if isinstance(value.get(m), (int, float))}


def misses(value: dict[str, Any], t: FaultSLOTargets) -> list[str]:
    """The targets an ok answer missed (its figure above the target)."""
    return [m for m in TARGETS
            if isinstance(value.get(m), (int, float)) and value[m] > getattr(t, m)]


class _Row:
    __slots__ = ("label", "kind", "victim", "start_ns", "from_ns", "heal_ns", "wall",
                 "inject_failed", "requests", "ok", "good", "ttft", "examples",
                 "last_missed_ns")

    def __init__(self, label: str, kind: str, victim: str, start_ns: int, bound_ns: int,
                 wall: str):
        self.label, self.kind, self.victim, self.wall = label, kind, victim, wall
        self.start_ns = start_ns
        self.from_ns = start_ns + bound_ns  # judged from here ...
        self.heal_ns: int | None = None  # ... until the heal began
        self.inject_failed = False
        self.requests = self.ok = self.good = 0
        self.ttft = LatencyHistogram()
        self.examples: list[dict[str, Any]] = []
        self.last_missed_ns: int | None = None  # the latest invoke, from the start, that missed

    def judges(self, t: int) -> bool:
        return not self.inject_failed and t >= self.from_ns and (
            self.heal_ns is None or t < self.heal_ns)


class FaultSLO(StreamingChecker):
    name = "fault_slo"
    needs = ("node_attribution",)  # a window is judged on the requests its victim got
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.t = ctx.settings.fault_slo
        self.bound_ns = int(ctx.settings.slo.failover_bound_s * 1e9)
        self.faults = FaultWindows(keep=0)
        self.stops = kinds.stopping_kinds()  # raises if no kind is loaded: never judge none
        self.rows: OrderedDict[str, _Row] = OrderedDict()
        # process -> (labels of the windows judging it, its schedule lag in ms, invoke ns)
        self.invoked: dict[Any, tuple[list[str], float, int]] = {}
        self.nodes: set[str] = set()  # every replica seen answering
        self.unplaced_in_windows = 0  # ok answers in a judged span naming no replica
        self.totals = {"windows": 0, "judged": 0, "violations": 0, "alone": 0,
                       "too_few_requests": 0, "inject_failed": 0}
        self.retired_rows = 0
        self.by_window: dict[str, int] = {}  # every window's violation, shown or not
        self.measured: dict[str, dict[str, Any]] = {}  # and its figures (known findings)
        self.examples: list[dict[str, Any]] = []

    # -- ops ----------------------------------------------------------------------
    def _on_harness(self, op: Op) -> None:
        change = self.faults.feed(op)
        if change is None:
            return
        w = change.window
        victim = victim_of(w.target, self.ctx.replicas)
        if w.kind not in self.stops or victim is None:
            return
        if change.what == OPENED:
            self.totals["windows"] += 1
            self.rows[w.label] = _Row(w.label, w.kind, victim, w.start_ns, self.bound_ns,
                                      w.start_wall)
            if len(self.rows) > MAX_WINDOW_ROWS:
                self._judge(self.rows.popitem(last=False)[1])
                self.retired_rows += 1
            return
        row = self.rows.get(w.label)
        if row is None:
            return
        if change.what == INJECT_FAILED:
            row.inject_failed = True
        elif change.what in (HEALING, CLOSED) and row.heal_ns is None:
            row.heal_ns = op.time_ns

    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            self._on_harness(op)
            return
        if op.type == "invoke":
            judged = [r.label for r in self.rows.values() if r.judges(op.time_ns)]
            if judged:
                lag = op.value.get("lag_ms")
                self.invoked[op.process] = (judged, float(lag) if isinstance(
                    lag, (int, float)) and lag > 0 else 0.0, op.time_ns)
            else:
                self.invoked.pop(op.process, None)
            return
        node = op.value.get("node")
        if op.type == "ok" and node is not None:
            self.nodes.add(node)
        labels, lag, sent_ns = self.invoked.pop(op.process, (None, 0.0, op.time_ns))
        if op.type == "ok" and node is None and labels:
            self.unplaced_in_windows += 1
        if not labels or is_withdrawn(op) or op.value.get("gap"):
            return
        figures = due_figures(op.value, lag)
        missed = misses(figures, self.t) if op.type == "ok" else [op.type]
        for label in labels:
            row = self.rows.get(label)
            if row is None:
                continue
            row.requests += 1
            if op.type == "ok":
                row.ok += 1
                if "ttft_ms" in figures:
                    row.ttft.add(float(figures["ttft_ms"]))
            if not missed:
                row.good += 1
                continue
            into = sent_ns - row.start_ns
            row.last_missed_ns = max(row.last_missed_ns or 0, into)
            if len(row.examples) < MAX_COUNTEREXAMPLES:
                row.examples.append({
                    "problem": f"sent {into / 1e9:.1f}s into "
                               f"{row.kind} on {row.victim}, "
                               + (f"missed {', '.join(missed)}" if op.type == "ok"
                                  else f"ended {op.type}: {op.error}"),
                    "window": row.label, "answered_by": node,
                    **figures, **({"lag_ms": lag} if lag else {}),
                    **op_brief(op)})

    # -- verdict ------------------------------------------------------------------
    def _judge(self, row: _Row) -> dict[str, Any]:
        """A window's figures and whether it met the targets; counted in the
        totals once (when it leaves the table, or at the result)."""
        goodput = round(row.good / row.requests, 4) if row.requests else None
        out: dict[str, Any] = {
            "kind": row.kind, "replica": row.victim, "begin_wall": row.wall,
            "judged_from_s": self.bound_ns / 1e9, "requests": row.requests, "ok": row.ok,
            "goodput": goodput,
            "ttft_p50_ms": row.ttft.quantile(0.5) if row.ttft.count else None,
            "ttft_p99_ms": row.ttft.quantile(0.99) if row.ttft.count else None,
            "met": None}
        if row.inject_failed:
            self.totals["inject_failed"] += 1
            out["why"] = "the inject failed"
        elif not (self.nodes - {row.victim}):
            self.totals["alone"] += 1
            out["why"] = "the only replica that answered: nowhere to fail over to"
        elif row.requests < self.t.min_requests:
            self.totals["too_few_requests"] += 1
            out["why"] = (f"{row.requests} request(s) sent after the failover bound, fewer "
                          f"than min_requests {self.t.min_requests:g}")
        else:
            self.totals["judged"] += 1
            out["met"] = goodput is not None and goodput >= self.t.min_goodput
            if not out["met"]:
                self.totals["violations"] += 1
                self.by_window[row.label] = 1
                self.measured[row.label] = {
                    "goodput": goodput, "requests": row.requests,
                    "missed": row.requests - row.good,
                    "last_missed_s": None if row.last_missed_ns is None
                    else round(row.last_missed_ns / 1e9, 3)}
                self.examples.extend(row.examples[:MAX_COUNTEREXAMPLES - len(self.examples)])
        return out

    def result(self) -> Result:
        # Judge copies of the totals: result() may be called mid-run (pure).
        saved = (dict(self.totals), list(self.examples), dict(self.by_window),
                 dict(self.measured))
        try:
            shown = {label: self._judge(row) for label, row in self.rows.items()}
            totals, examples = dict(self.totals), list(self.examples)
            by_window, measured = dict(self.by_window), dict(self.measured)
        finally:
            self.totals, self.examples, self.by_window, self.measured = saved
        t = self.t
        details: dict[str, Any] = {
            **totals,
            "targets": {m: getattr(t, m) for m in TARGETS},
            "min_goodput": t.min_goodput, "min_requests": t.min_requests,
            "failover_bound_s": self.bound_ns / 1e9,
            "violations_by_window": by_window,
            "measured_by_window": measured,
            "windows_shown": shown,
            "windows_not_shown": self.retired_rows,
        }
        if not totals["violations"] and totals["windows"] and not self.nodes:
            details["why"] = NO_NODE_NAMED  # every window would be "alone": nothing judged
            return Result(self.name, "unknown", details, [])
        partial = partial_attribution(self.ctx, totals["alone"], self.unplaced_in_windows)
        if not totals["violations"] and partial:
            details["why"] = partial
            return Result(self.name, "unknown", details, [])
        return Result(self.name, not totals["violations"], details, examples)
