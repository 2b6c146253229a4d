"""Replica errors: the replicas answer no more server errors (5xx) outside
fault windows than the run's error budget allows, whatever the clients saw.

A router that retries a 5xx on another replica hides it from the client:
the client's error rate stays 0 while one replica fails every request it
is given, the cluster runs on less capacity than it reports, and every
retried request pays the failed attempt's latency (a gateway whose backend
answered 80% 5xx kept its clients' failures at 0% while its p95 grew ten
times). The client cannot see it; the replicas' own served journals can
(engines.vllm.node_header records each answer's status), and this checker
counts each replica's 5xx answers.

Judged outside fault windows only: a fault may make a replica answer errors
(fault_slo and availability judge what the clients saw there). An answer is
put in the window open when the monitor read it, or one that closed at most
``JOURNAL_LAG_S`` before (ordeal.history.windows.WindowNear); those are
counted (``in_fault_windows``), not judged. Outside them the share of 5xx
answers must stay within ``max_error_rate`` (the steady-state error budget
of the SLO, the same as error_rate's). ``retried_ok`` counts the 5xx ids a
replica later answered 200 in full: the router's retries hid them.

Memory: the 5xx ids of the last ``duplicate_window_s`` waiting for a later
answer, at most ``MAX_PENDING``; at most ``MAX_COUNTEREXAMPLES`` examples.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ordeal.history.ops import MONITOR, Op
from ordeal.history.windows import WindowNear

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief
from .duplicates import JOURNAL_LAG_S

MAX_PENDING = 10_000  # 5xx ids waiting to be seen answered again


class ReplicaErrors(StreamingChecker):
    name = "replica_errors"
    needs = ("served_journal",)
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.budget = ctx.settings.slo.max_error_rate
        self.window_ns = int(ctx.settings.duplicate_window_s * 1e9)
        self.windows = WindowNear(JOURNAL_LAG_S)
        self.counts = {"answers": 0, "server_errors": 0, "in_fault_windows": 0,
                       "answers_outside_windows": 0, "errors_outside_windows": 0,
                       "retried_ok": 0, "journal_errors": 0}
        self.by_node: dict[str, int] = {}
        self.by_status: dict[str, int] = {}
        self.pending: OrderedDict[str, int] = OrderedDict()  # 5xx id -> time seen
        self.examples: list[dict[str, Any]] = []

    def feed(self, op: Op) -> None:
        self.windows.feed(op)
        if op.process != MONITOR or op.f != "served":
            return
        c = self.counts
        if op.error:
            c["journal_errors"] += 1
        while self.pending and (op.time_ns - next(iter(self.pending.values())) > self.window_ns
                                or len(self.pending) > MAX_PENDING):
            self.pending.popitem(last=False)
        node = str(op.value.get("node"))
        window = self.windows.at(op.time_ns)
        for rid, status, complete in op.value.get("entries", []):
            c["answers"] += 1
            if window is None:
                c["answers_outside_windows"] += 1
            if not (isinstance(status, int) and status >= 500):
                if status == 200 and complete and self.pending.pop(rid, None) is not None:
                    c["retried_ok"] += 1
                continue
            c["server_errors"] += 1
            if window is not None:
                c["in_fault_windows"] += 1
                continue
            c["errors_outside_windows"] += 1
            self.by_node[node] = self.by_node.get(node, 0) + 1
            self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1
            self.pending[rid] = op.time_ns
            if len(self.examples) < MAX_COUNTEREXAMPLES:
                self.examples.append({
                    "problem": f"{node} answered {status} to request {rid} outside any fault "
                               "window", "node": node, "status": status, "request_id": rid,
                    **op_brief(op)})

    def result(self) -> Result:
        c: dict[str, Any] = dict(self.counts)
        outside, errors = c["answers_outside_windows"], c["errors_outside_windows"]
        c.update(max_error_rate=self.budget, by_node=dict(self.by_node),
                 by_status=dict(self.by_status),
                 error_share_outside_windows=round(errors / outside, 4) if outside else None)
        if c["answers"] == 0:
            return Result(self.name, "unknown", {**c, "why": "no replica journaled an answer"})
        valid = not (errors and errors / max(1, outside) > self.budget)
        if not valid:
            c["violations"] = errors
            worst = max(self.by_node, key=lambda n: self.by_node[n])
            c["summary"] = (f"{errors} of {outside} replica answers outside fault windows were "
                            f"server errors ({worst}: {self.by_node[worst]}); {c['retried_ok']} "
                            "of them a replica answered again in full (the router's retries "
                            f"hid them from the clients); budget {self.budget:.1%}")
        return Result(self.name, valid, details=c, counterexamples=list(self.examples))
