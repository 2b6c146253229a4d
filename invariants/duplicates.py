"""No duplicated execution: one client request runs to completion on at most
one replica, once.

A router that retries a request after the replica already ran it (the answer
was lost on the way back, or the router gave up waiting) makes the cluster do
the work twice: twice the GPU time, and for a tool-calling agent twice the
side effect. The client cannot see it; the replicas can. Each replica's
served journal (engines.vllm.node_header) records every request id it answered
and whether it sent the whole response; the monitor copies the journals into
the history as ``served`` ops, and this checker counts executions per id.

Retries after a replica failed *before* finishing are legitimate and are
counted, not judged. Memory is bounded: an id is forgotten ``window_s``
after it was first seen (a retry comes within the request timeout, seconds;
default window 15 minutes), so a 72-hour run holds only recent ids.

Each duplicate is put in the fault window it happened in (``window``, and
``violations_by_window``), so a known finding can name the fault kind that
provokes it (vllm-router re-sends completed requests during
``connection_reset``): the window open when the duplicate was seen, or one
that closed at most ``JOURNAL_LAG_S`` before (the monitor reads the
journals every few seconds).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ordeal.history.ops import MONITOR, Op
from ordeal.history.windows import WindowNear

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief

#: How long after a fault window closed a duplicate seen in the journals is
#: still put in it: the monitor's journal reads lag by its interval (2 s).
JOURNAL_LAG_S = 10.0


class NoDuplicateExecution(StreamingChecker):
    name = "no_duplicate_execution"
    needs = ("served_journal",)
    pure_result = True  # its state (15 minutes of ids) is the largest: never copied

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.window_ns = int(ctx.settings.duplicate_window_s * 1e9)
        # rid -> [first seen ns, completed executions, attempts, nodes]
        self.seen: OrderedDict[str, list[Any]] = OrderedDict()
        self.counts = {"journal_entries": 0, "requests": 0, "completed": 0,
                       "retried": 0, "duplicated": 0, "journal_errors": 0}
        self.duplicates: list[dict[str, Any]] = []
        self.windows = WindowNear(JOURNAL_LAG_S)
        self.by_window: dict[str, int] = {}
        self.unplaced = 0  # duplicates in no fault window

    def feed(self, op: Op) -> None:
        self.windows.feed(op)
        if op.process != MONITOR or op.f != "served":
            return
        if op.error:
            self.counts["journal_errors"] += 1
        node = op.value.get("node")
        while self.seen and op.time_ns - next(iter(self.seen.values()))[0] > self.window_ns:
            self.seen.popitem(last=False)
        for rid, status, complete in op.value.get("entries", []):
            self.counts["journal_entries"] += 1
            rec = self.seen.get(rid)
            if rec is None:
                rec = self.seen[rid] = [op.time_ns, 0, 0, []]
                self.counts["requests"] += 1
            rec[2] += 1
            if rec[2] == 2:
                self.counts["retried"] += 1
            rec[3].append(f"{node}:{status}:{'complete' if complete else 'cut'}")
            if complete and status == 200:
                rec[1] += 1
                self.counts["completed"] += 1
                if rec[1] == 2:
                    self.counts["duplicated"] += 1
                    window = self.windows.at(op.time_ns)
                    if window is None:
                        self.unplaced += 1
                    else:
                        self.by_window[window] = self.by_window.get(window, 0) + 1
                    if len(self.duplicates) < MAX_COUNTEREXAMPLES:
                        self.duplicates.append({"request_id": rid, "executions": list(rec[3]),
                                                "window": window, **op_brief(op)})

    def result(self) -> Result:
        c: dict[str, Any] = dict(self.counts)
        if c["duplicated"]:
            c["violations"] = c["duplicated"]
            c["in_no_fault_window"] = self.unplaced
            if not self.unplaced:  # each one placed: known findings can match them by window
                c["violations_by_window"] = dict(self.by_window)
        if c["duplicated"]:
            valid: bool | str = False
        elif c["journal_entries"] == 0:
            valid = "unknown"  # no journal: nothing seen from the replicas' side
        else:
            valid = True
        return Result(self.name, valid, details=c, counterexamples=list(self.duplicates))
