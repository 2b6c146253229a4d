"""drift: what only hours show. Over a long run, each node's memory, open
file descriptors and threads, its KV cache when idle, and each fault kind's
recovery time must not trend upwards: a replica that grows 30 MB an hour
is 2 GB after 72 hours, a router that keeps a socket per failed worker runs
out of descriptors, a KV cache never freed after aborted requests fills.

Each series is a straight line fitted by least squares to 5-minute means
(means, so two samples a second apart do not count as independent evidence),
with its 95% confidence interval, per hour of wall time. A node that
restarts (its pid changes) starts a new segment: the slope is the one line
that fits every segment, each with its own level (a restart frees what a
leak held; the growth between restarts is the leak). The first
``drift_settle_s`` of each segment are left out: caches filling and code
paging in after a start are warm-up, not drift.

A series is a finding when even its slope's lower confidence bound is above
its bound (``CheckerSettings.drift_*_per_h``), so noise never fails a run; a
series shorter than ``drift_min_span_h`` is shown, not judged. Every figure
comes with its growth extrapolated to 72 hours.

Streaming and bounded: per series, the running sums of its segments and at
most ``MAX_POINTS`` points kept for the report's chart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ordeal.history.ops import MONITOR, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker
from .slo import Recovery

#: Points kept per series for the report; past that, neighbours are merged.
MAX_POINTS = 600
#: The horizon every slope is extrapolated to.
HORIZON_H = 72.0


def t_quantile_975(dof: int) -> float:
    """Student's t at 97.5% (a two-sided 95% interval) for ``dof`` degrees of
    freedom: the Cornish-Fisher expansion around the normal 1.96, within 1%
    of the table from 3 degrees of freedom (1: 12.71, 2: 4.30 from the table)."""
    if dof <= 0:
        return math.inf
    if dof == 1:
        return 12.706
    if dof == 2:
        return 4.303
    z = 1.959964
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


@dataclass
class _Segment:
    """Running sums of one segment's points (t in hours)."""

    n: int = 0
    st: float = 0.0
    sy: float = 0.0
    stt: float = 0.0
    sty: float = 0.0
    syy: float = 0.0

    def add(self, t: float, y: float) -> None:
        self.n += 1
        self.st += t
        self.sy += y
        self.stt += t * t
        self.sty += t * y
        self.syy += y * y


@dataclass
class Series:
    """One quantity over the run: points are bucket means, per segment."""

    unit: str
    bound_per_h: float | None  # None: shown, not judged
    bucket_s: float = 300.0
    settle_s: float = 0.0
    segments: dict[Any, _Segment] = field(default_factory=dict)
    points: list[tuple[float, float]] = field(default_factory=list)  # (t h, mean)
    _seg_start: dict[Any, float] = field(default_factory=dict)
    _bucket: tuple[Any, float, float, int] | None = None  # (segment, start s, sum, count)
    t_range: tuple[float, float] | None = None  # first and last point, hours

    def add(self, t_s: float, y: float, segment: Any = 0) -> None:
        """A sample at ``t_s`` seconds into the run."""
        start = self._seg_start.setdefault(segment, t_s)
        if t_s - start < self.settle_s:
            return
        b = self._bucket
        if b is not None and (b[0] != segment or t_s - b[1] >= self.bucket_s):
            self._commit()
            b = None
        if b is None:
            self._bucket = (segment, t_s, y, 1)
        else:
            self._bucket = (segment, b[1], b[2] + y, b[3] + 1)

    def add_point(self, t_s: float, y: float, segment: Any = 0) -> None:
        """A value that is its own point (a fault's recovery time)."""
        self._commit()
        self._record(segment, t_s / 3600, y)

    def _commit(self) -> None:
        if self._bucket is None:
            return
        segment, start, total, count = self._bucket
        self._bucket = None
        self._record(segment, (start + self.bucket_s / 2) / 3600, total / count)

    def _record(self, segment: Any, t_h: float, y: float) -> None:
        self.segments.setdefault(segment, _Segment()).add(t_h, y)
        lo, hi = self.t_range or (t_h, t_h)
        self.t_range = (min(lo, t_h), max(hi, t_h))
        self.points.append((round(t_h, 4), y))
        if len(self.points) > MAX_POINTS:  # halve: mean of each neighbour pair
            odd = self.points[-1:] if len(self.points) % 2 else []
            self.points = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
                           for a, b in zip(self.points[::2], self.points[1::2])] + odd

    def fit(self) -> dict[str, Any]:
        """The slope per hour common to every segment, its 95% interval,
        the span covered and the growth extrapolated to ``HORIZON_H``."""
        self._commit()
        n = sum(s.n for s in self.segments.values())
        used = [s for s in self.segments.values() if s.n >= 2]
        ttt = sum(s.stt - s.st**2 / s.n for s in used)
        tty = sum(s.sty - s.st * s.sy / s.n for s in used)
        yyy = sum(s.syy - s.sy**2 / s.n for s in used)
        lo_t, hi_t = self.t_range or (0.0, 0.0)
        out: dict[str, Any] = {"unit": self.unit, "points": n, "segments": len(self.segments),
                               "span_h": round(hi_t - lo_t, 3), "bound_per_h": self.bound_per_h}
        dof = sum(s.n for s in used) - len(used) - 1
        if ttt <= 0 or dof < 1:
            return {**out, "slope_per_h": None}
        slope = tty / ttt
        rss = max(0.0, yyy - slope * tty)
        half = t_quantile_975(dof) * math.sqrt(rss / dof / ttt)
        last = self.points[-1][1] if self.points else None
        return {**out, "slope_per_h": _r(slope), "ci95_per_h": [_r(slope - half), _r(slope + half)],
                "growth_72h": _r(slope * HORIZON_H), "last": _r(last) if last is not None else None,
                "bound_72h": _r(self.bound_per_h * HORIZON_H) if self.bound_per_h is not None else None}


def _r(x: float) -> float:
    return float(f"{x:.4g}")


class Drift(StreamingChecker):
    name = "drift"
    needs = ("process_tree",)
    pure_result = False

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        s = ctx.settings
        self.bounds = s.drift_bounds()
        self.settle_s = s.drift_settle_s
        self.min_span_h = s.drift_min_span_h
        self.t0: int | None = None
        self.t0_wall: str | None = None  # the first op's wall time: the charts' zero
        self.series: dict[tuple[str, str], Series] = {}
        self.counters: dict[str, tuple[Any, float, float]] = {}  # node -> (pid, t s, requests)
        self.recovery = Recovery()
        self.recovery.start(ctx)

    def _series(self, node: str, what: str, unit: str, settle: bool = True) -> Series:
        key = (node, what)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(unit, self.bounds.get(what),
                                          settle_s=self.settle_s if settle else 0.0)
        return s

    def feed(self, op: Op) -> None:
        self.recovery.feed(op)
        if self.t0 is None:
            self.t0, self.t0_wall = op.time_ns, op.wall
        if (op.process != MONITOR or op.f not in ("sample", "drain", "process")
                or "node" not in op.value):
            return
        v = op.value
        t = (op.time_ns - self.t0) / 1e9
        node, pid = str(v["node"]), v.get("pid")
        if v.get("rss_bytes") is not None:
            self._series(node, "rss_mb", "MB").add(t, v["rss_bytes"] / 2**20, pid)
        for what in ("fds", "threads"):
            if v.get(what) is not None:
                self._series(node, what, "count").add(t, float(v[what]), pid)
        m = v.get("metrics") or {}
        busy = m.get("vllm:num_requests_running", 0) + m.get("vllm:num_requests_waiting", 0)
        if "vllm:kv_cache_usage_perc" in m and busy == 0 and v.get("health") == 200:
            self._series(node, "kv_cache_idle", "share").add(t, m["vllm:kv_cache_usage_perc"], pid)
        done = m.get("vllm:request_success_total")
        if done is not None:
            before = self.counters.get(node)
            self.counters[node] = (pid, t, done)
            if before is not None and before[0] == pid and t > before[1] and done >= before[2]:
                rate = (done - before[2]) / (t - before[1]) * 60
                self._series(node, "requests_per_min", "req/min", settle=False).add(t, rate, pid)

    def _recovery_series(self) -> None:
        windows = self.recovery.result().details.get("windows", {})
        for w in self.recovery.timeline.windows:
            rec = windows.get(w.label, {}).get("recovery_s")
            if rec is None or w.end_ns is None or self.t0 is None:
                continue
            s = self._series(f"kind:{w.kind}", "recovery_s", "s", settle=False)
            s.add_point((w.end_ns - self.t0) / 1e9, float(rec))

    def result(self) -> Result:
        for key in [k for k in self.series if k[1] == "recovery_s"]:
            del self.series[key]  # rebuilt from the windows on every call
        self._recovery_series()
        figures: dict[str, dict[str, Any]] = {}
        problems: list[dict[str, Any]] = []
        judged = 0
        for (node, what), s in sorted(self.series.items()):
            fit = s.fit()
            fit["chart"] = [[round(t, 4), _r(y)] for t, y in s.points]
            figures.setdefault(node, {})[what] = fit
            if fit["bound_per_h"] is None or fit["slope_per_h"] is None:
                continue
            if fit["span_h"] < self.min_span_h:
                fit["judged"] = f"no: spans {fit['span_h']} h < drift_min_span_h {self.min_span_h}"
                continue
            judged += 1
            fit["judged"] = "yes"
            if fit["ci95_per_h"][0] > fit["bound_per_h"]:
                problems.append({
                    "problem": f"{node} {what} grows {fit['slope_per_h']} {s.unit}/h (95% "
                               f"interval {fit['ci95_per_h']}), above the bound "
                               f"{fit['bound_per_h']} {s.unit}/h: {fit['growth_72h']} {s.unit} "
                               f"over 72 h", "node": node, "series": what})
        details = {"t0_wall": self.t0_wall, "bounds_per_h": self.bounds, "settle_s": self.settle_s,
                   "min_span_h": self.min_span_h, "series_judged": judged, "nodes": figures}
        if problems:
            return Result(self.name, False, details, problems[:MAX_COUNTEREXAMPLES])
        if not judged:
            details["why"] = (f"no series spans drift_min_span_h ({self.min_span_h} h) after its "
                              f"settling time: too short a run to judge drift")
            return Result(self.name, "unknown", details)
        return Result(self.name, True, details)
