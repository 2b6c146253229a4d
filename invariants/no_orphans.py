"""No orphans: after a kill, no process of the dead node lives on past a
bound.

An orphaned engine (its API server died and it did not notice) holds its
memory, its GPU and the node's port; the restart then fails, or runs beside
it and shares the device. The evidence is the heal of each ``process_kill``
(faults/process_kill.py): before it restarts the node it waits until
``orphan_bound_s`` after the kill for every process the inject recorded (the
node's group, and the processes carrying its labels outside it) to be gone,
and records those still alive then in ``orphans`` (pid, names, seconds after
the kill), then ends them by pid. Each orphan is a violation.

A kill nobody announced (a crash, the OOM killer, a supervisor's forced
stop) has no heal to check it. The monitor's samples do: a sample of a node
whose main process has ended lists what of its process group still runs
(``survivors``); a survivor still there ``orphan_bound_s`` after the first
sample that saw the main process gone is an orphan too (``unannounced``),
unless a ``process_kill`` window on that node is open (its heal judges it).
These are in no fault window, so no known finding covers them.

Not judged, and counted: a kill whose inject failed; and a heal that recorded
no orphan check (a crashed harness's heal-all, a history from before the
check, a heal that failed before it), which makes the result "unknown" when
nothing failed: no kill goes unjudged as true. The Ray node faults
end the engines Ray orphans as part of their heal (``orphans_ended``); that
is Ray's behaviour on a lost node, shown in their heal and not judged here.

Memory: one counter set, at most ``MAX_ORPHAN_ROWS`` windows itemised (a
violation in a window past them is counted, and no known finding can cover
it; ``measured_by_window`` gives each itemised window's ``orphans``,
``scope`` and ``oldest_orphan_s``, the age the heal found its oldest orphan
at, for a known finding's bounds), at most ``MAX_COUNTEREXAMPLES`` examples.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, MONITOR, Op
from ordeal.history.windows import CLOSED, FaultWindows

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief

KILL = "process_kill"
#: Windows itemised in violations_by_window (all are counted): twice the window
#: checkers' rows (invariants.base), as a heal here is a row of its own.
MAX_ORPHAN_ROWS = 64


class NoOrphans(StreamingChecker):
    name = "no_orphans"
    needs = ("process_tree",)
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.faults = FaultWindows(keep=0)
        self.counts = {"kills": 0, "checked": 0, "not_checked": 0, "orphans": 0,
                       "kills_with_orphans": 0, "unannounced_orphans": 0}
        self.by_scope: dict[str, int] = {}
        self.by_window: dict[str, int] = {}
        self.measured: dict[str, dict[str, Any]] = {}  # the same windows' figures
        self.examples: list[dict[str, Any]] = []
        self.bound_ns = int(ctx.settings.orphan_bound_s * 1e9)
        # (node, pid of its ended main process) -> when a sample first saw it ended
        self.ended_at: dict[tuple[str, Any], int] = {}
        self.unannounced: set[tuple[str, int]] = set()  # (node, orphan pid), counted once

    def _sample(self, op: Op) -> None:
        """A monitor sample of a node whose main process has ended."""
        v = op.value
        node = str(v.get("node"))
        key = (node, v.get("pid"))
        first = self.ended_at.setdefault(key, op.time_ns)
        if any(w.kind == KILL and w.target == node for w in self.faults.open.values()):
            return  # an announced kill: its heal checks its orphans
        if op.time_ns - first < self.bound_ns:
            return
        for pid, names in v.get("survivors") or []:
            if (node, pid) in self.unannounced:
                continue
            self.unannounced.add((node, pid))
            self.counts["unannounced_orphans"] += 1
            if len(self.examples) < MAX_COUNTEREXAMPLES:
                after_s = round((op.time_ns - first) / 1e9, 1)
                self.examples.append({
                    "problem": f"pid {pid} ({names}) of {node} still ran {after_s}s after its "
                               f"main process ended (exit {v.get('exit_code')}) with no fault "
                               f"announced; bound {self.bound_ns / 1e9:.0f}s",
                    "pid": pid, "names": names, "node": node, "window": None,
                    "alive_after_exit_s": after_s, **op_brief(op)})

    def feed(self, op: Op) -> None:
        if op.process not in HARNESS:
            return
        if op.process == MONITOR and op.f in ("sample", "drain") and "exit_code" in op.value:
            self._sample(op)
        change = self.faults.feed(op)
        if change is None or change.what != CLOSED or change.window.kind != KILL:
            return
        w = change.window
        if w.injected_ns is None or w.inject_error:
            return
        self.counts["kills"] += 1
        heal = w.heal_value
        orphans = heal.get("orphans")
        if not isinstance(orphans, list):
            self.counts["not_checked"] += 1
            return
        self.counts["checked"] += 1
        scope = str(heal.get("scope") or "node")
        self.by_scope[scope] = self.by_scope.get(scope, 0) + 1
        if not orphans:
            return
        self.counts["orphans"] += len(orphans)
        self.counts["kills_with_orphans"] += 1
        if len(self.by_window) < MAX_ORPHAN_ROWS:
            self.by_window[w.label] = len(orphans)
            ages = [o.get("alive_after_kill_s") for o in orphans]
            self.measured[w.label] = {
                "orphans": len(orphans), "scope": scope,
                # None when one age is missing: beyond any known finding's bound
                "oldest_orphan_s": max(ages) if all(isinstance(a, (int, float))
                                                    for a in ages) else None}
        for o in orphans:
            if len(self.examples) >= MAX_COUNTEREXAMPLES:
                break
            self.examples.append({
                "problem": f"pid {o.get('pid')} ({o.get('names')}) of {w.target} still ran "
                           f"{o.get('alive_after_kill_s')}s after the kill ({scope}); bound "
                           f"{heal.get('orphan_bound_s')}s",
                "window": w.label, **o})

    def result(self) -> Result:
        c = self.counts
        # Unannounced orphans are in no window: the window counts then fall
        # short of the total, and no known finding can cover the run.
        violations = c["orphans"] + c["unannounced_orphans"]
        details: dict[str, Any] = {**c, "kills_by_scope": dict(self.by_scope),
                                   "violations": violations,
                                   "violations_by_window": dict(self.by_window),
                                   "measured_by_window": dict(self.measured),
                                   "orphan_bound_s": self.bound_ns / 1e9}
        # A kill whose heal recorded no orphan check was not judged: "unknown"
        # unless an orphan was found elsewhere (never true for what nobody saw).
        valid: bool | str = False if violations else ("unknown" if c["not_checked"] else True)
        if valid == "unknown":
            details["why"] = (f"{c['not_checked']} kill(s) healed with no orphan check (a "
                              "crashed harness's heal-all, or a heal that failed first)")
        return Result(self.name, valid, details, list(self.examples))
