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

from typing import Iterable

from ordeal.history import NEMESIS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, op_brief


class NoSilentLoss:
    name = "no_silent_loss"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        open_ops: dict[int | str, Op] = {}
        problems: list[dict] = []
        counts = {"invoked": 0, "completed": 0, "never_completed": 0,
                  "completion_without_invoke": 0, "invoke_while_open": 0}

        def problem(kind: str, op: Op) -> None:
            counts[kind] += 1
            if len(problems) < MAX_COUNTEREXAMPLES:
                problems.append({"problem": kind, **op_brief(op)})

        for op in history:
            if op.process == NEMESIS:
                continue
            if op.type == "invoke":
                counts["invoked"] += 1
                if op.process in open_ops:
                    # The earlier request of this process never completed.
                    problem("invoke_while_open", open_ops[op.process])
                open_ops[op.process] = op
            else:
                if open_ops.pop(op.process, None) is None:
                    problem("completion_without_invoke", op)
                else:
                    counts["completed"] += 1
        for op in open_ops.values():
            problem("never_completed", op)

        bad = sum(v for k, v in counts.items() if k not in ("invoked", "completed"))
        if bad:
            valid = False
        elif counts["invoked"] == 0:
            valid = "unknown"  # nothing was sent: there is nothing to vouch for
        else:
            valid = True
        return Result(self.name, valid, details=counts, counterexamples=problems)
