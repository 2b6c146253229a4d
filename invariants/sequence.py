"""sequence_consistent: a stateful (sequence-batched) model must never
continue a sequence with state the client did not build.

The client (engines.triton.client) records in each ``sequence`` invoke what
it sends: correlation id, position (``step``), START/END and the value. The
model answers ``count``, ``total`` and ``applied_step``. From the steps the
server acknowledged, the checker knows what a correct server must answer:

* an ok answer to step ``s`` of a live sequence with ``c`` steps acknowledged
  and running total ``t`` must be count ``c + 1``, total ``t + value`` and
  applied step ``s``; a START must be count 1, total ``value``;
* anything else in an ok answer is the violation: the server went on from
  state that differs from the client's (a step it skipped, applied twice, or
  a second START it took as a continuation).

A rejected step is never a violation: rejecting is what a server must do
when what arrives is out of order (a sequence jump in flight), or when it
no longer holds the sequence (a restarted replica: "must specify the START
flag"). The rejections are counted by cause; a rejection of a step the client
sent in order and on a live sequence, with an out-of-order or live-START
message, is a *detected jump*: something between client and server changed
the step, and the server caught it. A failed or unknown (``info``) step
leaves the sequence's state unknown: its later steps are not judged.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief

#: Words in a server's rejection -> why it rejected.
CAUSES = (("out of order", "out_of_order"), ("start for a live sequence", "live_start"),
          ("must specify the start flag", "unknown_sequence"),
          ("unknown sequence", "unknown_sequence"))


def rejection_cause(error: str | None) -> str:
    low = (error or "").lower()
    for words, cause in CAUSES:
        if words in low:
            return cause
    return "other"


class SequenceConsistent(StreamingChecker):
    name = "sequence_consistent"
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.pending: dict[Any, dict[str, Any]] = {}  # process -> the invoke's value
        self.state: dict[int, tuple[int, int]] = {}  # sequence id -> (count, total) acked
        self.unknown: set[int] = set()  # sequences whose state the client cannot know
        self.counts = {"sequences": 0, "steps": 0, "ok": 0, "judged": 0, "lost_or_unknown": 0}
        self.rejected: dict[str, int] = {}
        self.jumps_detected = 0
        self.detected: list[dict[str, Any]] = []  # a few detected jumps, as evidence
        self.bad: list[dict[str, Any]] = []

    def feed(self, op: Op) -> None:
        if op.f != "sequence":
            return
        if op.type == "invoke":
            self.pending[op.process] = op.value
            return
        inv = self.pending.pop(op.process, None)
        if inv is None or "sequence_id" not in inv:
            return
        self.counts["steps"] += 1
        sid, step, start, end = inv["sequence_id"], inv["step"], inv["start"], inv["end"]
        if start:
            self.counts["sequences"] += 1
        if op.type == "ok":
            self.counts["ok"] += 1
            self._ok(op, sid, step, start, end, int(inv["value"]))
        elif op.type == "fail":
            cause = rejection_cause(op.error)
            self.rejected[cause] = self.rejected.get(cause, 0) + 1
            in_order = (start and sid not in self.state) or self.state.get(sid, (-1,))[0] == step
            if in_order and sid not in self.unknown and cause in ("out_of_order", "live_start"):
                self.jumps_detected += 1
                if len(self.detected) < MAX_COUNTEREXAMPLES:
                    self.detected.append({**op_brief(op), "sequence_id": sid, "step": step,
                                          "cause": cause})
            self._forget(sid)
        else:  # info: it may have been applied
            self.counts["lost_or_unknown"] += 1
            self._forget(sid)

    def _forget(self, sid: int) -> None:
        self.state.pop(sid, None)
        self.unknown.add(sid)

    def _ok(self, op: Op, sid: int, step: int, start: bool, end: bool, value: int) -> None:
        v = op.value
        if start:
            want = (1, value)
        elif sid in self.unknown:
            return  # an earlier step failed or was lost: the state is unknown
        elif sid not in self.state:
            self._violation(op, sid, "the server continued a sequence the client never "
                            "started (or had ended)", None, v)
            return
        else:
            count, total = self.state[sid]
            if step != count:
                self._violation(op, sid, f"the client sent step {step} after {count} acknowledged "
                                "steps and the server accepted it", (count + 1, total + value), v, step)
                self._forget(sid)
                return
            want = (count + 1, total + value)
        self.counts["judged"] += 1
        got = (v.get("count"), v.get("total"))
        if got != want or v.get("applied_step") != step:
            self._violation(op, sid, "the server answered state that the acknowledged steps do "
                            "not give (it went on from a skipped, repeated or restarted step)",
                            want, v, step)
            self._forget(sid)
            return
        self.unknown.discard(sid)
        if end:
            self.state.pop(sid, None)
        else:
            self.state[sid] = want

    def _violation(self, op: Op, sid: int, why: str, want: tuple[int, int] | None,
                   got: dict[str, Any], step: int | None = None) -> None:
        if len(self.bad) < MAX_COUNTEREXAMPLES:
            self.bad.append({**op_brief(op), "sequence_id": sid, "why": why,
                             "expected": None if want is None else {
                                 "count": want[0], "total": want[1], "applied_step": step},
                             "answered": {k: got.get(k) for k in ("count", "total",
                                                                  "applied_step")}})
        self.counts.setdefault("violations", 0)
        self.counts["violations"] += 1

    def result(self) -> Result:
        details = {**self.counts, "rejected": dict(self.rejected),
                   "jumps_detected": self.jumps_detected, "detected_examples": list(self.detected)}
        if self.counts["steps"] == 0:
            return Result(self.name, "unknown", {**details, "why": "no sequence step in the "
                                                 "history (the workload sent none)"})
        return Result(self.name, not self.bad, details, list(self.bad))
