"""No silent loss: every request the client invoked ends in exactly one of
ok, fail or info.

A missing completion means the harness lost track of a request, and with it
the evidence of what the cluster did; a completion without an invoke, or two
completions, means the history itself cannot be trusted. Both make every
other verdict suspect, which is why this checker exists.

Ops are paired by process: a client process has at most one request in
flight (Jepsen's rule), so memory is bounded by concurrency.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief


class NoSilentLoss(StreamingChecker):
    name = "no_silent_loss"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.open_ops: dict[int | str, Op] = {}
        self.problems: list[dict[str, Any]] = []
        self.counts = {"invoked": 0, "completed": 0, "never_completed": 0,
                       "completion_without_invoke": 0, "invoke_while_open": 0}

    def _problem(self, kind: str, op: Op) -> None:
        self.counts[kind] += 1
        if len(self.problems) < MAX_COUNTEREXAMPLES:
            self.problems.append({"problem": kind, **op_brief(op)})

    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            return
        if op.type == "invoke":
            self.counts["invoked"] += 1
            if op.process in self.open_ops:
                # The earlier request of this process never completed.
                self._problem("invoke_while_open", self.open_ops[op.process])
            self.open_ops[op.process] = op
        elif self.open_ops.pop(op.process, None) is None:
            self._problem("completion_without_invoke", op)
        else:
            self.counts["completed"] += 1

    def result(self) -> Result:
        for op in self.open_ops.values():
            self._problem("never_completed", op)
        self.open_ops = {}
        bad = sum(v for k, v in self.counts.items() if k not in ("invoked", "completed"))
        if bad:
            valid: bool | str = False
        elif self.counts["invoked"] == 0:
            valid = "unknown"  # nothing was sent: there is nothing to vouch for
        else:
            valid = True
        return Result(self.name, valid, details=dict(self.counts),
                      counterexamples=self.problems)
