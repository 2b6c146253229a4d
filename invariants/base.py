"""Checkers judge a history; they never talk to a cluster and never raise.

A checker is pure and streaming: one pass over the ops, memory bounded by
what is in flight (not by the length of the run), so a 72-hour history is
checked in minutes. ``valid`` is True, False, or "unknown" (could not judge:
e.g. the checker itself failed, or nothing relevant happened). Combining ranks
False > "unknown" > True, as Jepsen's ``merge-valid`` does.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Protocol, Sequence

from ordeal.history.ops import Op

from .settings import CheckerSettings

Validity = bool | Literal["unknown"]
MAX_COUNTEREXAMPLES = 5
#: Fault windows a window checker shows one row each (failover, fault_slo,
#: stream_continuity); every window is still counted in its totals and, when
#: it broke the invariant, in ``violations_by_window``.
MAX_WINDOW_ROWS = 32


@dataclass(frozen=True)
class RunContext:
    """What a checker may know about the run besides its ops."""

    run_id: str = ""
    settings: CheckerSettings = field(default_factory=CheckerSettings)
    #: Data this run's cluster cannot give, and why (an external deployment:
    #: no served journals, no process trees); a checker that ``needs`` one
    #: reports "unknown" with the reason (``not_judgeable``).
    unavailable: dict[str, str] = field(default_factory=dict)
    #: The cluster's replica names (``replica-0``... on Ordeal's clusters;
    #: what the target file names on an external one): which fault targets
    #: are replicas, for failover and fault_slo (``failover.victim_of``).
    replicas: tuple[str, ...] = ()
    #: Data this cluster gives its own way, and how (an external deployment
    #: naming its replicas in a header of its own): a checker that ``needs``
    #: it says so in ``judged_with``.
    provided: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    name: str
    valid: Validity
    details: dict[str, Any] = field(default_factory=dict)
    counterexamples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "valid": self.valid,
            "details": self.details,
            "counterexamples": self.counterexamples,
        }


class Checker(Protocol):
    name: str

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result: ...


class StreamingChecker:
    """Base of every checker: ``start``, then ``feed`` each op once, then
    ``result``. Feeding makes one pass serve all checkers (``check_all``)
    and lets a long run be judged while it goes; ``check`` is the one-call
    form for a whole history."""

    name = "checker"
    #: What the checker's judgement rests on besides the client's ops:
    #: ``served_journal`` (the replicas' record of request ids they ran),
    #: ``process_tree`` (the nodes' processes on this machine),
    #: ``node_attribution`` (which replica answered each request).
    needs: tuple[str, ...] = ()
    #: ``result()`` only reads the state: a running judge (runs.endurance)
    #: may call it mid-run without copying the checker first. False (the
    #: default) for checkers whose result closes what is still open.
    pure_result = False

    def start(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def feed(self, op: Op) -> None:
        raise NotImplementedError

    def result(self) -> Result:
        raise NotImplementedError

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        self.start(ctx)
        for op in history:
            self.feed(op)
        return self.result()


def op_brief(op: Op) -> dict[str, Any]:
    """A counterexample entry: enough to find the op in history.jsonl."""
    return {"index": op.index, "type": op.type, "process": op.process, "f": op.f,
            "wall": op.wall, "error": op.error}


def merge_valid(values: Iterable[Validity]) -> Validity:
    seen_unknown = False
    for v in values:
        if v is False:
            return False
        if v != True:  # noqa: E712 - "unknown" and anything unexpected
            seen_unknown = True
    return "unknown" if seen_unknown else True


def _crashed(checker: object, e: BaseException) -> Result:
    return Result(
        name=getattr(checker, "name", type(checker).__name__),
        valid="unknown",
        details={"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()},
    )


def check_all(checkers: Sequence[StreamingChecker], history: Iterable[Op],
              ctx: RunContext) -> list[Result]:
    """Judge ``history`` with every checker in one pass. A checker that
    raises is set aside with an "unknown" result carrying its error; the
    others go on."""
    live: list[StreamingChecker] = []
    failed: dict[int, Result] = {}
    for i, c in enumerate(checkers):
        try:
            c.start(ctx)
            live.append(c)
        except Exception as e:  # noqa: BLE001
            failed[i] = _crashed(c, e)
    for op in history:
        for c in list(live):
            try:
                c.feed(op)
            except Exception as e:  # noqa: BLE001
                failed[checkers.index(c)] = _crashed(c, e)
                live.remove(c)
    results = []
    for i, c in enumerate(checkers):
        if i in failed:
            results.append(failed[i])
            continue
        try:
            results.append(not_judgeable(c, c.result(), ctx))
        except Exception as e:  # noqa: BLE001
            results.append(_crashed(c, e))
    return results


def not_judgeable(checker: object, result: Result, ctx: RunContext) -> Result:
    """``result``, made "unknown" with the reasons when the checker needs
    data the cluster cannot give: without it a True would be a false pass.
    A False stands: what it found is in the data it had."""
    missing = {n: ctx.unavailable[n] for n in getattr(checker, "needs", ())
               if n in ctx.unavailable}
    given = {n: ctx.provided[n] for n in getattr(checker, "needs", ()) if n in ctx.provided}
    if given:
        result.details["judged_with"] = given
    if not missing:
        return result
    result.details["not_judgeable"] = missing
    if result.valid is not False:
        result.valid = "unknown"
    return result


def run_checker(checker: Checker, history: Iterable[Op], ctx: RunContext) -> Result:
    """Run one checker; an exception inside it becomes an "unknown" result
    carrying the error, never a crash of the harness."""
    try:
        return checker.check(history, ctx)
    except Exception as e:  # noqa: BLE001 - the point is to contain anything
        return _crashed(checker, e)
