"""Stream well-formed: every streamed response that the client took as a
success was one coherent SSE stream.

What the workload's SSE parser records per request (``value["stream"]``):
``ids`` (distinct response ids in order of appearance), ``finish_reasons``
(every non-null finish_reason seen), ``done`` ([DONE] received),
``after_done`` (events after [DONE]), ``sequence_problems`` (a jump,
repeat or step back of the running completion_tokens that continuous usage
stats put in every chunk: a lost, duplicated or reordered event; a router
that drops ``continuous_usage_stats``, as vllm-router 0.1.17 does, leaves
chunks without it, and then lost or repeated events are still caught by
usage_matches_tokens and reorders by the greedy canaries), ``errors`` (``error`` events, which
vLLM can send mid-stream under HTTP 200) and ``malformed`` (data lines that
are not JSON). The parser records facts; this checker judges them:

- an ``ok`` stream must have exactly one id, exactly one finish_reason,
  [DONE] last with nothing after it, no error event and no malformed line;
- a stream with an error event must not be ``ok`` (errors under HTTP 200
  are failures), and is counted in ``mid_stream_errors``;
- a malformed data line is a server fault whatever the op's type;
- a stream whose HTTP body ended in good order (``clean_eof``: status 200,
  the last chunk received, no transport error) without [DONE] is one the
  server or a proxy closed itself: whatever the op's type (the client keeps
  it as ``info``, since it cannot tell what the engine did), a client that
  does not look for [DONE] takes the cut answer as whole (failure zoo:
  faults/zoo/stream_cut_without_done.py). Counted in ``cut_without_done``.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief


def stream_problems(op: Op, stream: dict[str, Any]) -> list[str]:
    found: list[str] = []
    if stream.get("malformed"):
        found.append(f"malformed SSE data line(s): {stream['malformed'][:2]!r}")
    if stream.get("sequence_problems"):
        found.append(f"stream sequence broken: {stream['sequence_problems'][:2]!r}")
    if op.type != "ok":
        if stream.get("clean_eof") and not stream.get("done"):
            reasons = stream.get("finish_reasons") or []
            found.append("the body ended in good order without [DONE]"
                         + ("" if reasons else " and without a finish_reason")
                         + ": a cut answer a client can take as whole")
        return found
    ids = stream.get("ids") or []
    if len(ids) != 1:
        found.append(f"expected one response id, saw {len(ids)}: {ids[:3]!r}")
    reasons = stream.get("finish_reasons") or []
    if len(reasons) != 1:
        found.append(f"expected exactly one finish_reason, saw {len(reasons)}: {reasons[:3]!r}")
    if not stream.get("done"):
        found.append("stream ended without [DONE]")
    if stream.get("after_done"):
        found.append(f"{stream['after_done']} event(s) after [DONE]")
    if stream.get("errors"):
        found.append(f"error event under a successful op: {stream['errors'][:1]!r}")
    return found


class StreamWellFormed(StreamingChecker):
    name = "stream_wellformed"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.counts = {"streams": 0, "ok_streams": 0, "malformed_streams": 0,
                       "mid_stream_errors": 0, "sequence_broken": 0, "cut_without_done": 0}
        self.examples: list[dict[str, Any]] = []

    def feed(self, op: Op) -> None:
        if op.process in HARNESS or op.type == "invoke":
            return
        stream = op.value.get("stream")
        if not isinstance(stream, dict):
            return
        self.counts["streams"] += 1
        if op.type == "ok":
            self.counts["ok_streams"] += 1
        if stream.get("errors"):
            self.counts["mid_stream_errors"] += 1
        if stream.get("sequence_problems"):
            self.counts["sequence_broken"] += 1
        if stream.get("clean_eof") and not stream.get("done"):
            self.counts["cut_without_done"] += 1
        found = stream_problems(op, stream)
        if found:
            self.counts["malformed_streams"] += 1
            if len(self.examples) < MAX_COUNTEREXAMPLES:
                self.examples.append({"problems": found, **op_brief(op)})

    def result(self) -> Result:
        c = self.counts
        if c["ok_streams"] == 0:
            # No successful stream: nothing proves streams are well formed.
            valid: bool | str = False if c["malformed_streams"] else "unknown"
        else:
            valid = c["malformed_streams"] == 0
        return Result(self.name, valid, details=dict(c), counterexamples=self.examples)
