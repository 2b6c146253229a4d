"""Checkers over the monitor's NVML readings (ops of process "monitor", f
"gpu"; see load.gpu_telemetry).

- gpu_memory_back: after the load drained, each GPU's memory used is back
  near its baseline (its first reading of the run), within
  ``gpu_mem_slack_mb`` (default 1024 MiB): a co-tenant that outlived its
  heal, or an engine that kept what a fault made it take, shows here. No
  readings (a CPU cluster) or no drained reading: "unknown", and it says so.
"""

from __future__ import annotations

from typing import Any

from ordeal.gpu import is_slowdown
from ordeal.history.ops import MONITOR, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker
from .requests import WARMUP, RequestPairer, Timeline
from .slo import meets_slo


class GpuMemoryBack(StreamingChecker):
    name = "gpu_memory_back"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.slack_mb = ctx.settings.gpu_mem_slack_mb
        self.baseline: dict[str, tuple[int, int]] = {}  # device -> (mem_used_mb, op index)
        self.drained: dict[str, tuple[int, int]] = {}
        self.peak: dict[str, int] = {}
        self.note: str | None = None

    def feed(self, op: Op) -> None:
        if op.process != MONITOR or op.f != "gpu":
            return
        v = op.value
        gpu = v.get("gpu")
        if not isinstance(gpu, dict):
            self.note = self.note or v.get("reason")
            return
        used = gpu.get("mem_used_mb")
        if not isinstance(used, int) or used < 0:
            return
        dev = f"gpu{v.get('device', '?')}"
        self.baseline.setdefault(dev, (used, op.index))
        self.peak[dev] = max(self.peak.get(dev, used), used)
        if v.get("phase") == "drain":
            self.drained[dev] = (used, op.index)

    def result(self) -> Result:
        figures: dict[str, Any] = {}
        problems = []
        for dev, (base, _) in self.baseline.items():
            figures[dev] = {"baseline_mb": base, "peak_mb": self.peak[dev],
                            "drained_mb": self.drained.get(dev, (None,))[0]}
            if dev not in self.drained:
                continue
            used, index = self.drained[dev]
            if used - base > self.slack_mb:
                problems.append({"problem": f"{dev} memory used {used} MiB after drain, "
                                            f"{used - base} MiB above its baseline {base} MiB "
                                            f"(slack {self.slack_mb:.0f} MiB)", "index": index})
        details: dict[str, Any] = {"slack_mb": self.slack_mb, "devices": figures}
        if problems:
            return Result(self.name, False, details, problems[:MAX_COUNTEREXAMPLES])
        if not self.drained:
            details["why_unknown"] = (self.note or "no GPU readings in the history") \
                if not self.baseline else "no drained GPU reading (the run did not drain)"
            return Result(self.name, "unknown", details)
        return Result(self.name, True, details)


class ThrottleExplained(StreamingChecker):
    """throttle_explained: every request outside a fault window (steady or
    after a heal; not the warm-up, ``warmup_s``: a fresh engine's first
    requests are slow with no throttle) that breaches an SLO target must be
    explained by a GPU slowdown that NVML reported while it ran (a power or
    thermal clocks-event reason: SwPowerCap, HwSlowdown, SwThermal, HwThermal,
    PowerBrake, in a reading between its invoke and its completion, give or
    take ``throttle_slack_s``, default 1 s). Breaches no reading explains are
    flagged (valid False, each one a counterexample): slowness no fault and no
    throttle accounts for. Without any GPU reading a breach cannot be
    explained: "unknown"."""

    name = "throttle_explained"
    MAX_PENDING = 10_000

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.t = ctx.settings.slo
        self.slack_ns = int(ctx.settings.throttle_slack_s * 1e9)
        self.warmup_s = ctx.settings.warmup_s
        self.pairer = RequestPairer(Timeline(self.t.after_heal_s, self.warmup_s))
        self.warmup_requests = 0
        self.slow_times: list[int] = []  # times of readings with a slowdown reason (bounded)
        self.readings = 0
        self.pending: list[tuple[int, int, int]] = []  # (t0, t1, done index) of breaches
        self.breaches = 0
        self.explained = 0
        self.flagged: list[dict[str, Any]] = []
        self.flagged_count = 0
        self.last_reading_ns = 0

    def feed(self, op: Op) -> None:
        if op.process == MONITOR and op.f == "gpu":
            gpu = op.value.get("gpu")
            if isinstance(gpu, dict):
                self.readings += 1
                self.last_reading_ns = op.time_ns
                bits = gpu.get("clocks_event_reasons")
                if isinstance(bits, int) and is_slowdown(bits):
                    self.slow_times.append(op.time_ns)
                    if len(self.slow_times) > self.MAX_PENDING:
                        del self.slow_times[: len(self.slow_times) // 2]
                self._settle(op.time_ns)
            return
        req = self.pairer.feed(op)
        if req is not None and req.phase == WARMUP:
            self.warmup_requests += 1
            return
        if req is None or req.phase == "fault" or req.done.type != "ok":
            return
        if not meets_slo(req, self.t):
            self.breaches += 1
            if len(self.pending) < self.MAX_PENDING:
                self.pending.append((req.invoke.time_ns, req.done.time_ns, req.done.index))

    def _settle(self, now_ns: int | None) -> None:
        keep = []
        for t0, t1, index in self.pending:
            if now_ns is not None and now_ns < t1 + self.slack_ns:
                keep.append((t0, t1, index))  # a reading that could explain it may follow
                continue
            if any(t0 - self.slack_ns <= t <= t1 + self.slack_ns for t in self.slow_times):
                self.explained += 1
            else:
                self.flagged_count += 1
                if len(self.flagged) < MAX_COUNTEREXAMPLES:
                    self.flagged.append({"problem": "SLO breach outside any fault window with "
                                                    "no GPU slowdown reason while it ran",
                                         "index": index,
                                         "ran_s": round((t1 - t0) / 1e9, 3)})
        self.pending = keep

    def result(self) -> Result:
        self._settle(None)
        details = {"breaches_outside_faults": self.breaches, "explained_by_throttle":
                   self.explained, "flagged": self.flagged_count, "gpu_readings": self.readings,
                   "slowdown_readings": len(self.slow_times),
                   "targets": {"ttft_ms": self.t.ttft_ms, "tpot_ms": self.t.tpot_ms,
                               "e2e_ms": self.t.e2e_ms}}
        if self.warmup_s > 0:  # the warm-up's requests, not judged here
            details.update(warmup_s=self.warmup_s, warmup_requests=self.warmup_requests)
        if self.breaches and not self.readings:
            details["why_unknown"] = "no GPU readings: a breach cannot be explained"
            return Result(self.name, "unknown", details)
        if self.flagged_count:
            return Result(self.name, False, details, self.flagged)
        return Result(self.name, True, details)
