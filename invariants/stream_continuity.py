"""Stream continuity: a stream cut by a fault ends as a failure with its
cause, never as a success with fewer tokens; and how many streams each kill
cost is a figure.

A replica killed under load meets the streams in flight on it. What the
client may then see: an error event, a lost connection, a stream without
[DONE] (``fail``/``info``, load.workload's classification), or, if a router
or the engine hides the cut, a stream that ends "normally" with fewer
tokens. The last is the defect this checker exists for. For every completed
streamed request (its invoke says ``stream`` and ``max_tokens``; its
completion's value has the facts load.sse recorded: ``stream.n_token_ids``,
``stream.finish_reasons``, ``stream.done``, ``usage.completion_tokens``):

- an ``ok`` stream with fewer tokens than its ``max_tokens`` must have
  finished with ``stop`` (the model ended it). ``length`` with fewer tokens,
  ``abort``, or no finish reason at all is "ok but truncated". Tokens are
  the token ids the client received (``n_token_ids``, exact); without them
  the billed ``usage.completion_tokens``; without either the stream is
  counted in ``uncounted`` and not judged (chunks are not tokens: vLLM merges
  tokens into one chunk when the client reads slowly);
- a stream that did not end ``ok`` must carry its cause (the op's error): a
  ``fail``/``info`` without one is a violation, since the failure could not
  be told from a harness bug.

Figures. A stream is *in flight at a fault* when its invoke came before the
fault window's start (the nemesis ``inject``/begin op, read with
``ordeal.history.windows.FaultWindows``) and its completion after it; it is
*lost* when it then ended non-``ok``. Per fault window (the latest
``MAX_WINDOW_ROWS`` shown; every window counted in ``by_kind``): streams in
flight, lost, and lost on the fault's target node (``x-ordeal-node``). Kill
windows (``KILL_KINDS``: ``process_kill`` and Ray's ``ray_node_loss``, both
SIGKILL a replica) give ``streams_in_flight_per_kill`` and
``streams_lost_per_kill``: over every kill window, those whose inject failed
included (``kills_inject_failed`` says how many: a kill that errored may
still have killed).

Retried or migrated streams. The history has no marker of a stream that a
router or engine continued elsewhere: the client sees one HTTP response (a
second response id inside it is stream_wellformed's finding), and the served
journals (no_duplicate_execution) record executions, not tokens. So whether a
continued stream equals, token for token, the greedy answer without the
fault is judged by ``canary_determinism`` for the greedy canaries (their
answers are compared with the golden answer of the same prompt); this
checker only counts the greedy streams (temperature 0) that were in flight
at a kill and still ended ``ok`` (``greedy_survivors_of_kills``), the ones
such a comparison covers.

Planted corruption: ``lsn_jump`` drops events on purpose, which can make an
``ok`` stream short; the checker is listed in ``invariants.planted.PLANTED``
and the requests that met such a window are withdrawn from it (and not
counted as lost).

Engines: vLLM only. Triton's streamed values (engines/triton/client.py,
``send_generate``) carry no ``stream`` record and a ``finish_reason`` the
client derives from the token count itself (``length`` when the count
reached ``max_tokens``, else ``stop``), so "ok but truncated" can never be
seen there and the verdict would be a vacuous pass; its adapter leaves it out.

Memory: one small record per request in flight, one row per shown window,
one per fault kind, at most ``MAX_COUNTEREXAMPLES`` counterexamples.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ordeal.history.ops import HARNESS, Op
from ordeal.history.windows import INJECT_FAILED, OPENED, FaultWindows

from .base import (
    MAX_COUNTEREXAMPLES,
    MAX_WINDOW_ROWS,
    Result,
    RunContext,
    StreamingChecker,
    op_brief,
)
from .planted import is_withdrawn

KILL_KINDS = frozenset({"process_kill", "ray_node_loss"})


def tokens_seen(value: dict[str, Any]) -> tuple[int | None, str]:
    """The tokens a completed stream delivered and how they were counted:
    ("token_ids" exact, "usage" billed) or (None, "none")."""
    stream = value.get("stream")
    n = stream.get("n_token_ids") if isinstance(stream, dict) else None
    if isinstance(n, int) and not isinstance(n, bool):
        return n, "token_ids"
    billed = (value.get("usage") or {}).get("completion_tokens")
    if isinstance(billed, int) and not isinstance(billed, bool):
        return billed, "usage"
    return None, "none"


def finish_reason(value: dict[str, Any]) -> str | None:
    """The stream's last finish reason (the completion's, else the stream's)."""
    reason = value.get("finish_reason")
    if reason is None:
        stream = value.get("stream")
        reasons = stream.get("finish_reasons") if isinstance(stream, dict) else None
        reason = reasons[-1] if reasons else None
    return reason if reason is None else str(reason)


class _Flight:
    """A streamed request in flight: what its judgement needs of the invoke,
    and the window rows of the faults that began during it."""

    __slots__ = ("greedy", "max_tokens", "met")

    def __init__(self, max_tokens: int, greedy: bool):
        self.max_tokens = max_tokens
        self.greedy = greedy
        self.met: list[dict[str, Any]] = []


class StreamContinuity(StreamingChecker):
    name = "stream_continuity"
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.faults = FaultWindows(keep=0)  # only what is open: the rows below keep the rest
        self.flights: dict[Any, _Flight] = {}
        self.rows: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.by_kind: dict[str, dict[str, int]] = {}
        self.counts = {"streams": 0, "ok_streams": 0, "non_ok_streams": 0,
                       "short_stop": 0, "uncounted": 0, "truncated_ok": 0,
                       "non_ok_without_cause": 0, "withdrawn": 0, "gap_closed": 0,
                       "greedy_survivors_of_kills": 0}
        self.examples: list[dict[str, Any]] = []

    # -- fault windows ----------------------------------------------------------
    def _kind(self, kind: str) -> dict[str, int]:
        k = self.by_kind.get(kind)
        if k is None:
            k = self.by_kind[kind] = {"windows": 0, "inject_failed": 0, "in_flight": 0,
                                      "lost": 0, "lost_on_target": 0}
        return k

    def _on_harness(self, op: Op) -> None:
        change = self.faults.feed(op)
        if change is None:
            return
        w = change.window
        if change.what == OPENED:
            self._kind(w.kind)["windows"] += 1
            row = {"kind": w.kind, "target": w.target, "begin_wall": w.start_wall,
                   "in_flight": 0, "lost": 0, "lost_on_target": 0, "inject_failed": False}
            self.rows[w.label] = row
            if len(self.rows) > MAX_WINDOW_ROWS:
                self.rows.popitem(last=False)  # still counted in by_kind
            for flight in self.flights.values():
                flight.met.append(row)
        elif change.what == INJECT_FAILED:
            row = self.rows.get(w.label)
            if row is None or not row["inject_failed"]:
                self._kind(w.kind)["inject_failed"] += 1
            if row is not None:
                row["inject_failed"] = True

    # -- requests ---------------------------------------------------------------
    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            self._on_harness(op)
            return
        if op.type == "invoke":
            if op.value.get("stream"):
                temperature = op.value.get("temperature")
                self.flights[op.process] = _Flight(int(op.value.get("max_tokens") or 0),
                                                   temperature == 0)
            else:
                self.flights.pop(op.process, None)
            return
        flight = self.flights.pop(op.process, None)
        if flight is None:  # not a stream, or no invoke seen: no_silent_loss's business
            return
        if is_withdrawn(op):
            self.counts["withdrawn"] += 1
            return
        if op.value.get("gap"):  # the harness died: its outcome is unknown, not a loss
            self.counts["gap_closed"] += 1
            return
        self.counts["streams"] += 1
        ok = op.type == "ok"
        self.counts["ok_streams" if ok else "non_ok_streams"] += 1
        node = op.value.get("node")
        for row in flight.met:
            kind = self._kind(row["kind"])
            row["in_flight"] += 1
            kind["in_flight"] += 1
            if not ok:
                row["lost"] += 1
                kind["lost"] += 1
                if node is not None and node == row["target"]:
                    row["lost_on_target"] += 1
                    kind["lost_on_target"] += 1
        if ok:
            if flight.greedy and any(r["kind"] in KILL_KINDS for r in flight.met):
                self.counts["greedy_survivors_of_kills"] += 1
            self._judge_ok(op, flight)
        elif not (op.error or "").strip():
            self._bad(op, "non_ok_without_cause",
                      f"stream ended {op.type} without a cause (no error recorded)",
                      {"max_tokens": flight.max_tokens, "node": node})

    def _judge_ok(self, op: Op, flight: _Flight) -> None:
        reason = finish_reason(op.value)
        if reason == "stop":
            seen, _ = tokens_seen(op.value)
            if seen is not None and flight.max_tokens and seen < flight.max_tokens:
                self.counts["short_stop"] += 1
            return
        if not flight.max_tokens:
            return  # no limit to fall short of
        seen, how = tokens_seen(op.value)
        if seen is None:
            self.counts["uncounted"] += 1
            return
        if seen < flight.max_tokens:
            self._bad(op, "truncated_ok",
                      f"ok but truncated: {seen} of max_tokens {flight.max_tokens} tokens "
                      f"and finish_reason {reason!r}",
                      {"tokens_seen": seen, "counted_by": how, "max_tokens": flight.max_tokens,
                       "finish_reason": reason, "node": op.value.get("node"),
                       "faults_met": [f"{r['kind']}@{r['target']}" for r in flight.met]})

    def _bad(self, op: Op, kind: str, why: str, facts: dict[str, Any]) -> None:
        self.counts[kind] += 1
        if len(self.examples) < MAX_COUNTEREXAMPLES:
            self.examples.append({"problem": why, **facts, **op_brief(op)})

    # -- verdict ----------------------------------------------------------------
    def result(self) -> Result:
        c = self.counts
        kill = {"windows": 0, "inject_failed": 0, "in_flight": 0, "lost": 0,
                "lost_on_target": 0}
        for kind in KILL_KINDS & self.by_kind.keys():
            for k, v in self.by_kind[kind].items():
                kill[k] += v
        kills = kill["windows"]
        # The first scalars are the report's key figures (reports/html.py shows 8).
        details: dict[str, Any] = {
            "streams": c["streams"],
            "kills": kills,
            "streams_in_flight_per_kill": round(kill["in_flight"] / kills, 3) if kills else None,
            "streams_lost_per_kill": round(kill["lost"] / kills, 3) if kills else None,
            "truncated_ok": c["truncated_ok"],
            "non_ok_without_cause": c["non_ok_without_cause"],
            "streams_in_flight_at_kills": kill["in_flight"],
            "streams_lost_at_kills": kill["lost"],
            "kills_inject_failed": kill["inject_failed"],
            **c,
            "in_flight_at_faults": sum(k["in_flight"] for k in self.by_kind.values()),
            "lost_at_faults": sum(k["lost"] for k in self.by_kind.values()),
            "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
            "windows": {label: dict(row) for label, row in self.rows.items()},
            "continuation": "retried/migrated streams are not marked in the history; "
                            "greedy continuations are judged by canary_determinism",
        }
        if c["truncated_ok"] or c["non_ok_without_cause"]:
            return Result(self.name, False, details, list(self.examples))
        if not c["streams"]:
            return Result(self.name, "unknown", {"why": "no streamed request completed in "
                                                        "this run", **details})
        return Result(self.name, True, details)
