"""SLO checkers: latency percentiles, goodput, error rate, availability
during faults, and recovery after each heal.

Latencies are ``vllm bench serve``'s, taken from the ops as the workload
recorded them: TTFT (first chunk carrying choices), ITL (gaps between
chunks), TPOT ((E2E - TTFT) / (output tokens - 1)), E2E. Each checker splits
its figures into steady state, each fault window and each after-heal window
(and the warm-up, when ``warmup_s`` sets one: its figures are shown, never
judged), and judges steady state against the targets (faults are allowed to
hurt; the availability and recovery checkers say by how much).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ordeal.history.ops import HARNESS, NEMESIS, Op
from ordeal.history.windows import Window, label_parts

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief
from .histogram import LatencyHistogram
from .requests import STEADY, WARMUP, Request, RequestPairer, Timeline
from .settings import SLOTargets

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
#: Figures kept beside METRICS: TTFT and E2E from the send (the client's own
#: clock), and the schedule lag (sent minus due).
SENT_METRICS = ("ttft_ms_sent", "e2e_ms_sent", "lag_ms")
#: Measured from when the request was due, not when it was sent: in the open
#: loop a request that waited for the in-flight limit (or for a harness too
#: busy to send it on time) waited as a user would have, and a clock started
#: at the send hides exactly the queueing a fault causes (coordinated
#: omission). TPOT and ITL are gaps inside the answer: the wait is not in them.
DUE_METRICS = ("ttft_ms", "e2e_ms")


def lag_ms(req: Request) -> float:
    """How late the request was sent against the schedule (0 when the load
    recorded none: the closed loop, or a history from before)."""
    v = req.invoke.value.get("lag_ms")
    return float(v) if isinstance(v, (int, float)) and v > 0 else 0.0


def figure(req: Request, metric: str) -> Any:
    """A latency figure of a finished request as the checkers judge it:
    ``DUE_METRICS`` from the due time (the client's figure plus the lag),
    the rest as recorded; ``*_sent`` the client's own; ``lag_ms`` the lag."""
    if metric == "lag_ms":
        return lag_ms(req)
    if metric.endswith("_sent"):
        return req.done.value.get(metric[:-len("_sent")])
    v = req.done.value.get(metric)
    if metric in DUE_METRICS and isinstance(v, (int, float)):
        return v + lag_ms(req)
    return v


def slo_miss(req: Request, t: SLOTargets) -> str | None:
    """Why a request misses the SLO (its outcome, or the first latency
    figure over its target), or None when it meets it."""
    if req.done.type != "ok":
        return f"ended {req.done.type}" + (f": {req.done.error}" if req.done.error else "")
    for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
        v = figure(req, m)
        if isinstance(v, (int, float)) and v > getattr(t, m):
            return f"{m} {v:.0f} > {getattr(t, m):.0f}"
    return None


def meets_slo(req: Request, t: SLOTargets) -> bool:
    return slo_miss(req, t) is None


class _Groups:
    """Figures per window label (steady, each fault, each after-heal).
    Latency histograms only where asked for: they are the costly part."""

    #: Latency histograms are kept per window for the latest this many fault
    #: and after-heal windows; an older window's are merged into one
    #: "earlier windows" group of its phase. A window's histograms are ~100 KB
    #: (measured: a 30-minute endurance run grew 0.3 MB a minute with them),
    #: so a 72-hour run with thousands of windows would otherwise grow by
    #: hundreds of MB; its counts (requests, ok, goodput) stay per window.
    MAX_LATENCY_WINDOWS = 16
    EARLIER = "earlier-windows"

    def __init__(self, latencies: bool = False) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.latencies = latencies
        self._with_hist: list[str] = []  # window keys holding histograms, oldest first

    def _new(self, phase: str) -> dict[str, Any]:
        return {"phase": phase, "requests": 0, "ok": 0, "fail": 0, "info": 0, "good": 0,
                "hist": ({m: LatencyHistogram() for m in METRICS + SENT_METRICS}
                         if self.latencies else {})}

    def get(self, req: Request) -> dict[str, Any]:
        key = req.window if req.phase != "after_heal" else f"after_heal:{req.window}"
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = self._new(req.phase)
            if self.latencies and req.phase not in (STEADY, WARMUP):
                self._with_hist.append(key)
                if len(self._with_hist) > self.MAX_LATENCY_WINDOWS:
                    self._fold(self._with_hist.pop(0))
        return g

    def _fold(self, key: str) -> None:
        old = self.groups[key]
        into = self.EARLIER if old["phase"] == "fault" else f"after_heal:{self.EARLIER}"
        agg = self.groups.setdefault(into, self._new(old["phase"]))
        for m, h in old["hist"].items():
            agg["hist"][m].merge(h)
        old["hist"] = {}
        old["latency_in"] = into

    def add(self, req: Request, t: SLOTargets) -> dict[str, Any]:
        g = self.get(req)
        g["requests"] += 1
        g[req.done.type] += 1
        if meets_slo(req, t):
            g["good"] += 1
        if req.done.type == "ok" and self.latencies:
            for m in METRICS + SENT_METRICS:
                val = figure(req, m)
                if isinstance(val, list):
                    g["hist"][m].extend(val)
                elif isinstance(val, (int, float)):
                    g["hist"][m].add(val)
        return g

    def figures(self) -> dict[str, Any]:
        out = {}
        for key, g in self.groups.items():
            n = g["requests"]
            out[key] = {
                "phase": g["phase"], "requests": n, "ok": g["ok"], "fail": g["fail"],
                "info": g["info"],
                "goodput": round(g["good"] / n, 4) if n else None,
                "error_rate": round((g["fail"] + g["info"]) / n, 4) if n else None,
                **{m: g["hist"][m].summary() for m in METRICS + SENT_METRICS
                   if m in g["hist"]},
                **({"latency_in": g["latency_in"]} if "latency_in" in g else {}),
            }
        return out


class _PhasedChecker(StreamingChecker):
    """Shared feed: pair requests, split by phase, keep figures per window."""

    latencies = False  # keep latency histograms per window

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.t = ctx.settings.slo
        self.warmup_s = ctx.settings.warmup_s
        self.timeline = Timeline(self.t.after_heal_s, self.warmup_s)
        self.pairer = RequestPairer(self.timeline)
        self.groups = _Groups(self.latencies)
        self.bad_steady: list[Request] = []

    def feed(self, op: Op) -> None:
        req = self.pairer.feed(op)
        if req is None:
            return
        self.groups.add(req, self.t)
        if (req.phase == STEADY and not meets_slo(req, self.t)
                and len(self.bad_steady) < MAX_COUNTEREXAMPLES):
            self.bad_steady.append(req)

    def warmup_details(self) -> dict[str, Any]:
        """The warm-up left out of the steady judgement (nothing without one,
        so a run without a warm-up has the details it always had)."""
        if self.warmup_s <= 0:
            return {}
        g = self.groups.groups.get(WARMUP)
        return {"warmup_s": self.warmup_s, "warmup_requests": g["requests"] if g else 0}


class LatencySLO(_PhasedChecker):
    name = "slo_latency"
    latencies = True

    def result(self) -> Result:
        t, groups = self.t, self.groups
        figures = groups.figures()
        steady = figures.get(STEADY)
        details: dict[str, Any] = {
            "targets": {m: getattr(t, m) for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
            "percentile": t.percentile, **self.warmup_details(), "windows": figures}
        if not steady or not steady["ok"]:
            return Result(self.name, "unknown",
                          {**details, "why": "no successful steady-state request"})
        breaches = {}
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            h = groups.groups[STEADY]["hist"][m]
            v = h.quantile(t.percentile / 100) if h.count else None
            if v is not None and v > getattr(t, m):
                breaches[m] = {"p": t.percentile, "value": round(v, 3), "target": getattr(t, m)}
        details["breaches"] = breaches
        return Result(self.name, not breaches, details)


class Goodput(_PhasedChecker):
    name = "goodput"

    def result(self) -> Result:
        figures = {k: {"phase": v["phase"], "requests": v["requests"], "goodput": v["goodput"]}
                   for k, v in self.groups.figures().items()}
        steady = figures.get(STEADY)
        details = {"min_goodput": self.t.min_goodput, **self.warmup_details(),
                   "windows": figures}
        if not steady or not steady["requests"]:
            return Result(self.name, "unknown", {**details, "why": "no steady-state request"})
        ok = steady["goodput"] >= self.t.min_goodput
        return Result(self.name, ok, details,
                      [] if ok else [{"problem": "missed an SLO", **op_brief(r.done)}
                                     for r in self.bad_steady])


class ErrorRate(_PhasedChecker):
    name = "error_rate"

    def result(self) -> Result:
        figures = {k: {"phase": v["phase"], "requests": v["requests"], "fail": v["fail"],
                       "info": v["info"], "error_rate": v["error_rate"]}
                   for k, v in self.groups.figures().items()}
        steady = figures.get(STEADY)
        details = {"max_error_rate": self.t.max_error_rate, **self.warmup_details(),
                   "windows": figures}
        if not steady or not steady["requests"]:
            return Result(self.name, "unknown", {**details, "why": "no steady-state request"})
        ok = steady["error_rate"] <= self.t.max_error_rate
        examples = [op_brief(r.done) for r in self.bad_steady if r.done.type != "ok"]
        return Result(self.name, ok, details, [] if ok else examples)


#: Targets that are the client's only way in, and the kinds that stop
#: traffic there: such a fault cuts every request whatever the cluster does
#: (no spare to fail over to), so availability shows those windows and does
#: not judge them. A fault there that only slows (latency, bandwidth, loss
#: that TCP retransmits) is judged like any other: a stack rides it out.
ENTRYPOINT_TARGETS = frozenset({"client-router", "router"})
OUTAGE_KINDS = frozenset({"process_kill", "process_pause", "network_partition",
                          "connection_reset", "http_fault"})


def entrypoint_outage(label: str) -> bool:
    """A window label ``kind@target#n`` of a fault that stops the entrypoint."""
    kind, target = label_parts(label)
    return kind in OUTAGE_KINDS and target in ENTRYPOINT_TARGETS


class Availability(_PhasedChecker):
    """Inside each fault window, the share of requests that still succeeded:
    what a cluster with a spare replica should keep up while one is down.
    A window of a fault that stops the entrypoint (``entrypoint_outage``)
    is shown, not judged: no stack can route around its only door."""

    name = "availability"

    def result(self) -> Result:
        per_window = {k: {"requests": v["requests"], "ok": v["ok"],
                          "availability": round(v["ok"] / v["requests"], 4)
                          if v["requests"] else None}
                      for k, v in self.groups.figures().items() if v["phase"] == "fault"}
        details = {"min_availability": self.t.min_availability, "windows": per_window,
                   "fault_windows": len(self.timeline.windows)}
        judged = {k: v for k, v in per_window.items() if not entrypoint_outage(k)}
        shown = sorted(set(per_window) - set(judged))
        if shown:
            details["not_judged"] = {"windows": shown, "why": "a fault on the entrypoint cuts "
                                     "every request: nothing to fail over to"}
        tolerable = [w for w in self.timeline.windows if not entrypoint_outage(w.label)]
        if not tolerable:
            return Result(self.name, True, {**details, "why": "no fault a cluster can ride out "
                                                              "in this run" if shown else
                                                       "no fault in this run"})
        if not judged:
            return Result(self.name, "unknown",
                          {**details, "why": "no request during a fault window"})
        low = {k: v for k, v in judged.items()
               if v["availability"] < self.t.min_availability}
        details["below"] = sorted(low)
        return Result(self.name, not low, details)


class Recovery(StreamingChecker):
    """After each heal: how long until the SLO holds again. Recovery time is
    from the end of the heal to the completion of the last request (invoked
    after the heal, within the after-heal window) that failed or missed the
    SLO; zero if none did. Not recovered if that is still happening in the
    window's last quarter, or if nothing was sent after the heal.

    Faults that overlap: a request after the last heal counts for every
    window healed within ``after_heal_s`` before it, not only the last one
    (a restart that ends while a co-tenant still holds memory has its
    after-heal requests after the co-tenant's heal; they tell whether the
    cluster recovered from both). Requests while another fault is still in
    place count for none: they are that fault's."""

    name = "recovery"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.t = ctx.settings.slo
        self.timeline = Timeline(self.t.after_heal_s)
        self.pairer = RequestPairer(self.timeline)
        self.last_bad: dict[str, int] = {}
        self.last_miss: dict[str, dict[str, Any]] = {}  # the request that set last_bad
        self.seen: dict[str, int] = {}
        self.after_ns = round(self.t.after_heal_s * 1e9)
        self.recent: deque[Window] = deque()  # healed windows, in heal order

    def feed(self, op: Op) -> None:
        req = self.pairer.feed(op)
        healed = self.timeline.faults.last_healed
        if healed is None:
            self.recent.clear()  # a gap: the resumed harness's requests are no one's recovery
        elif not self.recent or self.recent[-1] is not healed:
            oldest = (healed.end_ns or 0) - self.after_ns
            while self.recent and (self.recent[0].end_ns or 0) < oldest:
                self.recent.popleft()
            self.recent.append(healed)
        if req is None or req.phase != "after_heal":
            return
        t = req.invoke.time_ns
        while self.recent and (self.recent[0].end_ns or 0) < t - self.after_ns:
            self.recent.popleft()
        labels = {w.label for w in self.recent if w.end_ns is not None and w.end_ns <= t}
        miss = slo_miss(req, self.t)
        for label in sorted(labels | {req.window}):
            self.seen[label] = self.seen.get(label, 0) + 1
            if miss is not None and req.done.time_ns >= self.last_bad.get(label, 0):
                self.last_bad[label] = req.done.time_ns
                self.last_miss[label] = {"miss": miss, **op_brief(req.done)}

    def result(self) -> Result:
        t = self.t
        out: dict[str, Any] = {}
        bad: list[dict[str, Any]] = []
        valid: bool | str = True
        for w in self.timeline.windows:
            if w.end_ns is None:
                out[w.label] = {"recovered": False, "why": "never healed"}
                bad.append({"problem": f"{w.label}: never healed", "window": w.label})
                valid = False
                continue
            if w.ended_by_gap:
                out[w.label] = {"recovered": None, "why": "the harness died in this window; "
                                "a resumed harness healed it"}
                continue
            if not self.seen.get(w.label) and w.label in self.timeline.cut_by_gap:
                out[w.label] = {"recovered": None, "why": "the harness died right after the "
                                "heal; its after-heal requests were cut (gap)"}
                continue
            if not self.seen.get(w.label):
                out[w.label] = {"recovered": None, "why": "no request after the heal"}
                if valid is True:
                    valid = "unknown"
                continue
            rec_s = max(0.0, (self.last_bad.get(w.label, w.end_ns) - w.end_ns) / 1e9)
            recovered = rec_s <= min(t.recovery_bound_s, 0.75 * t.after_heal_s)
            out[w.label] = {"recovered": recovered, "recovery_s": round(rec_s, 3),
                            "requests_after_heal": self.seen[w.label]}
            if w.label in self.last_miss:
                out[w.label]["last_miss"] = self.last_miss[w.label]
            if not recovered:
                valid = False
                bound = min(t.recovery_bound_s, 0.75 * t.after_heal_s)
                bad.append({"problem": f"{w.label}: the SLO held again only {rec_s:.1f}s after "
                                       f"the heal (bound {bound:g}s); the last miss: "
                                       f"{self.last_miss[w.label]['miss']}",
                            "window": w.label, "recovery_s": round(rec_s, 3),
                            **self.last_miss[w.label]})
        details = {"recovery_bound_s": t.recovery_bound_s, "after_heal_s": t.after_heal_s,
                   "windows": out}
        if not self.timeline.windows:
            return Result(self.name, True, {**details, "why": "no fault in this run"})
        return Result(self.name, valid, details, bad[:MAX_COUNTEREXAMPLES])


class RestartReadiness(StreamingChecker):
    """A node killed and restarted must serve again within the bound; the
    heal's ``ready_after_s`` is measured by the fault itself (start to
    /health 200). A restart that failed is a counterexample whose
    ``problem`` is the node's own reason where its log gave one (vLLM that
    met a full device: "out of memory: ..."), and ``while`` names the other
    faults in place then (a co-tenant holding the memory the restart needs)."""

    name = "restart_readiness"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.t = ctx.settings.slo
        self.restarts: list[dict[str, Any]] = []
        self.in_place: list[str] = []  # "kind on target" of each fault injected, not healing

    def feed(self, op: Op) -> None:
        if op.process != NEMESIS or op.f not in ("inject", "heal"):
            return
        here = f"{op.value.get('kind')} on {op.value.get('target')}"
        phase = op.value.get("phase")
        if op.f == "inject" and phase == "end" and not op.error:
            self.in_place.append(here)
        elif op.f == "heal" and phase == "begin" and here in self.in_place:
            self.in_place.remove(here)
        if op.f != "heal" or phase != "end":
            return
        restart: dict[str, Any] = {"target": op.value.get("target"), "index": op.index}
        if self.in_place:
            restart["while"] = list(self.in_place)
        if op.value.get("restarted"):
            restart["ready_after_s"] = op.value.get("ready_after_s")
            if "restart_phases" in op.value:  # where the time went, as the node told it
                restart["phases"] = op.value["restart_phases"]
            self.restarts.append(restart)
        elif op.error:
            failed = op.value.get("restart_failed")
            failed = failed if isinstance(failed, dict) else {}
            why = failed.get("reason") or ("no reason in its log: " + str(op.error)[:200])
            self.restarts.append({**restart, "ready_after_s": None, "error": op.error,
                                  "problem": f"{restart['target']} did not serve again after "
                                             f"its restart: {why}",
                                  **({"restart_failed": failed} if failed else {})})

    def result(self) -> Result:
        details = {"restart_bound_s": self.t.restart_bound_s, "restarts": self.restarts}
        if not self.restarts:
            return Result(self.name, True, {
                **details, "why": "no node was restarted in this run: nothing to wait for"})
        late = [r for r in self.restarts
                if r["ready_after_s"] is None or r["ready_after_s"] > self.t.restart_bound_s]
        for r in late:
            r.setdefault("problem", f"{r['target']} served again {r['ready_after_s']} s after "
                                    f"its restart began, past the {self.t.restart_bound_s:g} s "
                                    "bound")
        return Result(self.name, not late, details, late[:MAX_COUNTEREXAMPLES])


class ScheduleLag(StreamingChecker):
    """Whether the load kept to its schedule: each open-loop request's lag
    (sent minus due). A run whose p99 lag is above ``max_schedule_lag_ms``
    measured the system under less load than it claims, or the harness's own
    delay, so it is "unknown" (harness-bound), never a pass. Requests that
    waited for the in-flight limit (``queued``) are counted apart: a stalled
    system fills the limit, and their wait is in the due-time TTFT and E2E
    the latency checkers judge."""

    name = "schedule_lag"
    pure_result = True

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.bound = ctx.settings.max_schedule_lag_ms
        self.lag = LatencyHistogram()
        self.queued = 0
        self.over = 0
        self.worst: Op | None = None

    def feed(self, op: Op) -> None:
        if op.type != "invoke" or op.process in HARNESS:
            return
        v = op.value.get("lag_ms")
        if not isinstance(v, (int, float)):
            return
        self.lag.add(float(v))
        self.queued += bool(op.value.get("queued"))
        self.over += v > self.bound
        if self.worst is None or v > self.worst.value["lag_ms"]:
            self.worst = op

    def result(self) -> Result:
        details: dict[str, Any] = {"max_schedule_lag_ms": self.bound, "requests": self.lag.count,
                                   "lag_ms": self.lag.summary(), "over_bound": self.over,
                                   "queued_for_in_flight_limit": self.queued}
        if not self.lag.count:
            return Result(self.name, True, {**details, "why": "no open-loop request (closed "
                                            "loop, or a history without due times)"})
        p99 = self.lag.quantile(0.99)
        if p99 <= self.bound:
            return Result(self.name, True, details)
        cause = (f"{self.queued} waited for the in-flight limit (max_in_flight): the system "
                 f"under test held them" if self.queued else
                 "none waited for the in-flight limit: the harness was too busy to send them on "
                 "time (too few cores for this rate; see --load-workers)")
        details["why"] = (f"harness-bound: p99 schedule lag {p99:.0f} ms > {self.bound:.0f} ms "
                          f"({self.over} of {self.lag.count} requests late past the bound; "
                          f"{cause}); the load offered was not the load planned")
        worst = [op_brief(self.worst)] if self.worst is not None else []
        return Result(self.name, "unknown", details, worst)
