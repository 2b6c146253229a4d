"""SLO checkers: latency percentiles, goodput, error rate, availability
during faults, and recovery after each heal.

Latencies are ``vllm bench serve``'s, taken from the ops as the workload
recorded them: TTFT (first chunk carrying choices), ITL (gaps between
chunks), TPOT ((E2E - TTFT) / (output tokens - 1)), E2E. Each checker splits
its figures into steady state, each fault window and each after-heal window,
and judges steady state against the targets (faults are allowed to hurt;
the availability and recovery checkers say by how much).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable

from ordeal.config import ConfigError
from ordeal.history import Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, op_brief
from .histogram import LatencyHistogram
from .requests import STEADY, Request, Timeline, paired_requests

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class SLOTargets:
    """Targets, with defaults sized for the tiny CPU model on a 2-core
    machine; real clusters should set their own (``--slo FILE``)."""

    ttft_ms: float = 2000.0  # per request, as vllm bench serve's --goodput ttft:
    tpot_ms: float = 200.0
    e2e_ms: float = 10000.0
    percentile: float = 99.0  # steady-state latency is judged at this percentile
    min_goodput: float = 0.95  # steady-state share of requests meeting every SLO
    max_error_rate: float = 0.01  # steady-state share of fail + info
    min_availability: float = 0.5  # share ok inside each fault window
    after_heal_s: float = 30.0  # length of the after-heal window
    recovery_bound_s: float = 30.0  # the SLO must hold again this soon after a heal
    restart_bound_s: float = 240.0  # a killed node must serve again this soon

    @classmethod
    def from_file(cls, path: str | Path) -> "SLOTargets":
        """Read ``[slo]`` from a TOML file; unknown keys are an error."""
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"--slo {p}: cannot read it as TOML ({e})") from e
        table = data.get("slo", data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"--slo {p}: unknown key(s) {unknown}; known: {sorted(known)}")
        try:
            return replace(cls(), **{k: float(v) for k, v in table.items()})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--slo {p}: every value must be a number ({e})") from e


def targets(ctx: RunContext) -> SLOTargets:
    t = ctx.extra.get("slo")
    return t if isinstance(t, SLOTargets) else SLOTargets()


def meets_slo(req: Request, t: SLOTargets) -> bool:
    if req.done.type != "ok":
        return False
    v = req.done.value
    return all(v.get(m) is None or v[m] <= getattr(t, m) for m in ("ttft_ms", "tpot_ms", "e2e_ms"))


class _Groups:
    """Figures per window label (steady, each fault, each after-heal)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}

    def get(self, req: Request) -> dict[str, Any]:
        key = req.window if req.phase != "after_heal" else f"after_heal:{req.window}"
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = {"phase": req.phase, "requests": 0, "ok": 0, "fail": 0,
                                    "info": 0, "good": 0,
                                    "hist": {m: LatencyHistogram() for m in METRICS}}
        return g

    def add(self, req: Request, t: SLOTargets) -> dict[str, Any]:
        g = self.get(req)
        g["requests"] += 1
        g[req.done.type] += 1
        if meets_slo(req, t):
            g["good"] += 1
        if req.done.type == "ok":
            v = req.done.value
            for m in METRICS:
                val = v.get(m)
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
                **{m: g["hist"][m].summary() for m in METRICS},
            }
        return out


def _collect(history: Iterable[Op], ctx: RunContext) -> tuple[_Groups, Timeline, list[Request]]:
    t = targets(ctx)
    timeline = Timeline(t.after_heal_s)
    groups = _Groups()
    bad_steady: list[Request] = []
    for req in paired_requests(history, timeline):
        groups.add(req, t)
        if req.phase == "steady" and not meets_slo(req, t) and len(bad_steady) < MAX_COUNTEREXAMPLES:
            bad_steady.append(req)
    return groups, timeline, bad_steady


class LatencySLO:
    name = "slo_latency"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        groups, _, _ = _collect(history, ctx)
        figures = groups.figures()
        steady = figures.get(STEADY)
        details: dict[str, Any] = {"targets": {m: getattr(t, m) for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
                                   "percentile": t.percentile, "windows": figures}
        if not steady or not steady["ok"]:
            return Result(self.name, "unknown", {**details, "why": "no successful steady-state request"})
        breaches = {}
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            h = groups.groups[STEADY]["hist"][m]
            if h.count:
                v = h.quantile(t.percentile / 100)
                if v is not None and v > getattr(t, m):
                    breaches[m] = {"p": t.percentile, "value": round(v, 3), "target": getattr(t, m)}
        details["breaches"] = breaches
        return Result(self.name, not breaches, details)


class Goodput:
    name = "goodput"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        groups, _, bad = _collect(history, ctx)
        figures = {k: {"phase": v["phase"], "requests": v["requests"], "goodput": v["goodput"]}
                   for k, v in groups.figures().items()}
        steady = figures.get(STEADY)
        details = {"min_goodput": t.min_goodput, "windows": figures}
        if not steady or not steady["requests"]:
            return Result(self.name, "unknown", {**details, "why": "no steady-state request"})
        ok = steady["goodput"] >= t.min_goodput
        return Result(self.name, ok, details,
                      [] if ok else [{"problem": "missed an SLO", **op_brief(r.done)} for r in bad])


class ErrorRate:
    name = "error_rate"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        groups, _, bad = _collect(history, ctx)
        figures = {k: {"phase": v["phase"], "requests": v["requests"], "fail": v["fail"],
                       "info": v["info"], "error_rate": v["error_rate"]}
                   for k, v in groups.figures().items()}
        steady = figures.get(STEADY)
        details = {"max_error_rate": t.max_error_rate, "windows": figures}
        if not steady or not steady["requests"]:
            return Result(self.name, "unknown", {**details, "why": "no steady-state request"})
        ok = steady["error_rate"] <= t.max_error_rate
        examples = [op_brief(r.done) for r in bad if r.done.type != "ok"]
        return Result(self.name, ok, details, [] if ok else examples)


class Availability:
    """Inside each fault window, the share of requests that still succeeded:
    what a cluster with a spare replica should keep up while one is down."""

    name = "availability"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        groups, timeline, _ = _collect(history, ctx)
        per_window = {k: {"requests": v["requests"], "ok": v["ok"],
                          "availability": round(v["ok"] / v["requests"], 4) if v["requests"] else None}
                      for k, v in groups.figures().items() if v["phase"] == "fault"}
        details = {"min_availability": t.min_availability, "windows": per_window,
                   "fault_windows": len(timeline.windows)}
        if not per_window:
            return Result(self.name, "unknown", {**details, "why": "no request during a fault window"})
        low = {k: v for k, v in per_window.items() if v["availability"] < t.min_availability}
        details["below"] = sorted(low)
        return Result(self.name, not low, details)


class Recovery:
    """After each heal: how long until the SLO holds again. Recovery time is
    from the end of the heal to the completion of the last request (invoked
    after the heal, within the after-heal window) that failed or missed the
    SLO; zero if none did. Not recovered if that is still happening in the
    window's last quarter, or if nothing was sent after the heal."""

    name = "recovery"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        timeline = Timeline(t.after_heal_s)
        last_bad: dict[str, int] = {}
        seen: dict[str, int] = {}
        for req in paired_requests(history, timeline):
            if req.phase != "after_heal":
                continue
            seen[req.window] = seen.get(req.window, 0) + 1
            if not meets_slo(req, t):
                last_bad[req.window] = max(last_bad.get(req.window, 0), req.done.time_ns)
        out: dict[str, Any] = {}
        valid: bool | str = True
        for w in timeline.windows:
            if w.end_ns is None:
                out[w.label] = {"recovered": False, "why": "never healed"}
                valid = False
                continue
            if not seen.get(w.label):
                out[w.label] = {"recovered": None, "why": "no request after the heal"}
                if valid is True:
                    valid = "unknown"
                continue
            rec_s = max(0.0, (last_bad.get(w.label, w.end_ns) - w.end_ns) / 1e9)
            recovered = rec_s <= min(t.recovery_bound_s, 0.75 * t.after_heal_s)
            out[w.label] = {"recovered": recovered, "recovery_s": round(rec_s, 3),
                            "requests_after_heal": seen[w.label]}
            if not recovered:
                valid = False
        details = {"recovery_bound_s": t.recovery_bound_s, "after_heal_s": t.after_heal_s,
                   "windows": out}
        if not timeline.windows:
            return Result(self.name, "unknown", {**details, "why": "no fault was healed"})
        return Result(self.name, valid, details)


class RestartReadiness:
    """A node killed and restarted must serve again within the bound; the
    heal's ``ready_after_s`` is measured by the fault itself (start to
    /health 200)."""

    name = "restart_readiness"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        t = targets(ctx)
        restarts = []
        for op in history:
            if op.f == "heal" and op.value.get("phase") == "end" and op.value.get("restarted"):
                restarts.append({"target": op.value.get("target"),
                                 "ready_after_s": op.value.get("ready_after_s"), "index": op.index})
            elif op.f == "heal" and op.value.get("phase") == "end" and op.error:
                restarts.append({"target": op.value.get("target"), "ready_after_s": None,
                                 "index": op.index, "error": op.error})
        details = {"restart_bound_s": t.restart_bound_s, "restarts": restarts}
        if not restarts:
            return Result(self.name, "unknown", {**details, "why": "no restart happened"})
        late = [r for r in restarts
                if r["ready_after_s"] is None or r["ready_after_s"] > t.restart_bound_s]
        return Result(self.name, not late, details, late[:MAX_COUNTEREXAMPLES])
