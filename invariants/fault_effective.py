"""Faults that took effect: every injected fault must show its effect in the
run's evidence, or the run proves nothing about it.

A chaos run whose partition matched no packet, whose toxic sat on a link no
request crossed, or whose throttle never throttled, "passes" because nothing
happened. This checker makes such a run ``unknown`` and says which fault did
nothing and what was looked at.

The evidence, per fault window whose inject succeeded:

- the fault's own observation of the system's state (faults.base
  ``Fault.observe``), taken by the heal just before the fault is undone and
  recorded in the heal/end op's ``effect``: ``{"effective": bool, "how":
  ..., "evidence": {...}}`` (a killed node's port refusing, a paused group in
  state T, packets matched by the chain, the toxic's hit count, a throttled
  cgroup, the co-tenant's memory or the device's load). ``effective`` None
  with an ``error``: the observation itself failed;
- for ``clock_drift``, the node's clock as it reports it, from two sources:
  passively, the ``created`` stamp of each answer of the target node,
  invoked after the fault was in (plus ``takes_effect_within_s``) and
  answered before its heal began, against the invoke's wall time; actively,
  the fault's own probe of the node's URL just before the heal
  (faults.clock_drift ``probe_clock``: the observation's
  ``evidence.probe.skew_s``), so a window no request of the load reached is
  judged too. The clock moved when either skew reaches ``clock_threshold_s``
  (half the injected offset, between ``MIN_CLOCK_S`` and ``MAX_CLOCK_S``:
  the stamps have a one-second resolution).

Verdict: ``unknown`` when any window's fault showed no effect, could not be
observed (an observation that failed, a clock_drift window with neither an
answer nor a probe reading of its target's clock) or left no evidence at all
(``not_observable``: a kind without an observation, such as ``lsn_jump``'s
sequence variant on Triton, the Ray node faults, a hook or a Toxiproxy link
Ordeal cannot read; a history written before observations existed): the
labels of those windows are in ``no_evidence``. The one exception is a kind
the user vouches for (``CheckerSettings.trusted_without_evidence``, the
target file's ``trusted_without_evidence``): its windows without evidence
are counted ``trusted`` and listed in ``trusted_without_evidence``, and do
not make the run unknown. A window ended by a harness death (``gap``) or
never healed is ``not_judged``. A run without a fault window has nothing to
prove here (True, ``windows`` 0).

Memory: the open clock_drift windows, one invoke wall time per request in
flight while one is open, at most ``MAX_COUNTEREXAMPLES`` examples and
``MAX_LISTED`` labels per list.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, Op, parse_iso
from ordeal.history.windows import CLOSED, HEALING, INJECTED, FaultWindows, Window

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker

CLOCK_KIND = "clock_drift"
MIN_CLOCK_S = 1.0
MAX_CLOCK_S = 2.0
DEFAULT_EFFECT_DELAY_S = 2.0
#: Window labels kept per list of the details (``no_evidence``,
#: ``trusted_without_evidence``); the counts say how many there were.
MAX_LISTED = 50


def clock_threshold_s(offset_s: Any) -> float:
    """The skew that shows a clock fault of ``offset_s`` took effect."""
    if isinstance(offset_s, (int, float)) and not isinstance(offset_s, bool) and offset_s:
        return max(MIN_CLOCK_S, min(MAX_CLOCK_S, abs(float(offset_s)) / 2))
    return MAX_CLOCK_S


def probe_reading(effect: Any) -> tuple[float | None, dict[str, Any]]:
    """The clock skew a clock_drift observation's probe read (its
    ``evidence.probe.skew_s``; None without one) and the probe's record."""
    evidence = effect.get("evidence") if isinstance(effect, dict) else None
    probe = evidence.get("probe") if isinstance(evidence, dict) else None
    probe = probe if isinstance(probe, dict) else {}
    skew = probe.get("skew_s")
    if isinstance(skew, bool) or not isinstance(skew, (int, float)):
        return None, probe
    return float(skew), probe


class _Clock:
    """An open clock_drift window: its target and the largest skew seen."""

    __slots__ = ("from_ns", "answers", "max_skew", "threshold", "target")

    def __init__(self, target: str, from_ns: int, threshold: float):
        self.target = target
        self.from_ns = from_ns
        self.threshold = threshold
        self.answers = 0
        self.max_skew = 0.0


class FaultEffective(StreamingChecker):
    name = "fault_effective"
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.faults = FaultWindows(keep=0)
        self.clocks: dict[str, _Clock] = {}  # window label -> open clock_drift window
        self.invoked: dict[Any, tuple[int, float | None]] = {}  # process -> (time_ns, wall)
        self.by_kind: dict[str, dict[str, int]] = {}
        self.counts = {"windows": 0, "effective": 0, "no_effect": 0, "unobserved": 0,
                       "not_observable": 0, "trusted": 0, "not_judged": 0}
        self.examples: list[dict[str, Any]] = []
        self.trusted_kinds = frozenset(ctx.settings.trusted_without_evidence)
        self.listed: dict[str, list[str]] = {"no_evidence": [], "trusted_without_evidence": []}

    def _kind(self, kind: str) -> dict[str, int]:
        k = self.by_kind.get(kind)
        if k is None:
            k = self.by_kind[kind] = {"windows": 0, "effective": 0, "no_effect": 0,
                                      "unobserved": 0, "not_observable": 0, "trusted": 0,
                                      "not_judged": 0}
        return k

    def _count(self, w: Window, what: str, example: dict[str, Any] | None = None) -> None:
        self.counts[what] += 1
        self._kind(w.kind)[what] += 1
        if example is not None and len(self.examples) < MAX_COUNTEREXAMPLES:
            self.examples.append({"window": w.label, "kind": w.kind, "target": w.target,
                                  "injected": w.injected_wall, "healed": w.end_wall,
                                  **example})

    # -- ops ----------------------------------------------------------------------
    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            self._on_harness(op)
            return
        if not self.clocks:
            self.invoked.clear()
            return
        if op.type == "invoke":
            self.invoked[op.process] = (op.time_ns, parse_iso(op.wall))
            return
        invoked = self.invoked.pop(op.process, None)
        created = op.value.get("created") if op.type == "ok" else None
        if invoked is None or not isinstance(created, int) or invoked[1] is None:
            return
        node = op.value.get("node")
        for clock in self.clocks.values():
            if node == clock.target and invoked[0] >= clock.from_ns:
                clock.answers += 1
                clock.max_skew = max(clock.max_skew, abs(created - invoked[1]))

    def _on_harness(self, op: Op) -> None:
        was_open = list(self.faults.open.values())
        change = self.faults.feed(op)
        if change is None:
            for w in was_open:  # a gap (a dead harness) ended them: counted, not judged
                if w.ended_by_gap:
                    self._judge(w, self.clocks.pop(w.label, None))
            return
        w = change.window
        if change.what == INJECTED and w.kind == CLOCK_KIND:
            delay = op.value.get("takes_effect_within_s", DEFAULT_EFFECT_DELAY_S)
            delay_ns = int(float(delay) * 1e9) if isinstance(delay, (int, float)) else 0
            self.clocks[w.label] = _Clock(w.target, op.time_ns + delay_ns,
                                          clock_threshold_s(op.value.get("offset_s")))
        elif change.what == HEALING:
            clock = self.clocks.get(w.label)
            if clock is not None:  # answers from here on may come from the healed clock
                clock.from_ns = 1 << 62
        elif change.what == CLOSED:
            self._judge(w, self.clocks.pop(w.label, None))

    def _judge(self, w: Window, clock: _Clock | None) -> None:
        if w.injected_ns is None or w.inject_error:
            return  # the fault never went in: nothing to show
        self.counts["windows"] += 1
        self._kind(w.kind)["windows"] += 1
        if w.ended_by_gap:
            self._count(w, "not_judged")
            return
        if w.kind == CLOCK_KIND and "heal_hook" not in w.heal_value:
            # Ordeal's own clock_drift; a hook's (an external deployment) has
            # no answer placed on its node, so it is judged like the others.
            self._judge_clock(w, clock)
            return
        effect = w.heal_value.get("effect")
        if not isinstance(effect, dict):
            self._no_evidence(w)
            return
        if effect.get("effective") is True:
            self._count(w, "effective")
        elif effect.get("effective") is False:
            self._count(w, "no_effect", {
                "problem": f"{w.kind} on {w.target} showed no effect: {effect.get('how')}",
                "evidence": effect.get("evidence")})
        else:
            self._count(w, "unobserved", {
                "problem": f"the effect of {w.kind} on {w.target} could not be observed: "
                           f"{effect.get('error') or effect}"})

    def _no_evidence(self, w: Window) -> None:
        """A window whose fault recorded no observation: trusted when the
        user vouches for its kind, else it proves nothing (unknown)."""
        if w.kind in self.trusted_kinds:
            self._count(w, "trusted")
            self._list("trusted_without_evidence", w.label)
            return
        self._count(w, "not_observable", {
            "problem": f"{w.kind} on {w.target} left no evidence of its effect (its kind has "
                       "no observation here); a fault not seen to act proves nothing. Vouch "
                       "for the kind with trusted_without_evidence in the target file, or "
                       "give it an observation"})
        self._list("no_evidence", w.label)

    def _list(self, name: str, label: str) -> None:
        if len(self.listed[name]) < MAX_LISTED:
            self.listed[name].append(label)

    def _judge_clock(self, w: Window, clock: _Clock | None) -> None:
        threshold = clock.threshold if clock is not None else MAX_CLOCK_S
        answers = clock.answers if clock is not None else 0
        max_skew = clock.max_skew if clock is not None else 0.0
        effect = w.heal_value.get("effect")
        skew, probe = probe_reading(effect)
        if skew is not None and abs(skew) < threshold and probe.get("inconclusive"):
            skew = None  # a strobed clock read in its real-time half
        if not answers and skew is None:
            error = (probe.get("inconclusive") or probe.get("error")
                     or (effect.get("error") if isinstance(effect, dict) else None))
            why = (f" (its probe: {error})" if error
                   else "" if probe else " and no probe of its clock was recorded")
            self._count(w, "unobserved", {
                "problem": f"no answer of {w.target} carried its clock (a 'created' stamp) "
                           f"while the fault was in{why}, so the clock's move cannot be seen"})
            return
        facts: dict[str, Any] = {"answers": answers, "threshold_s": threshold}
        seen = []
        if answers:
            facts["max_skew_s"] = round(max_skew, 1)
            seen.append(f"the 'created' stamps of its {answers} answer(s) stayed within "
                        f"{max_skew:.1f} s of the harness's clock")
        if skew is not None:
            facts.update(probe_skew_s=round(skew, 1), probe_source=probe.get("source"))
            seen.append(f"its clock read by a probe was {skew:+.1f} s off the harness's")
        if answers and max_skew >= threshold or skew is not None and abs(skew) >= threshold:
            self._count(w, "effective")
            return
        self._count(w, "no_effect", {
            "problem": f"clock_drift on {w.target} showed no effect: " + "; ".join(seen),
            "evidence": facts})

    # -- verdict ------------------------------------------------------------------
    def result(self) -> Result:
        c = self.counts
        listed = {k: list(v) for k, v in self.listed.items() if v}
        details: dict[str, Any] = {**c, **listed,
                                   "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
                                   "windows_open": len(self.faults.open)}
        if c["trusted"]:
            details = {"note": f"{c['trusted']} fault window(s) left no evidence of their "
                               "effect and were counted on the user's word (the target file's "
                               "trusted_without_evidence): "
                               + ", ".join(self.listed["trusted_without_evidence"]),
                       **details}
        if c["no_effect"] or c["unobserved"] or c["not_observable"]:
            parts = [f"{n} {what}" for n, what in (
                (c["no_effect"], "showed no effect"),
                (c["unobserved"], "could not be observed"),
                (c["not_observable"], "left no evidence of their effect "
                                      f"({', '.join(self.listed['no_evidence'])})")) if n]
            why = (f"fault window(s): {'; '.join(parts)}; a fault not seen to act proves "
                   "nothing about the system")
            return Result(self.name, "unknown", {"why": why, **details}, list(self.examples))
        return Result(self.name, True, details)
