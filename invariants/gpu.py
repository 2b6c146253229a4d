"""Checkers over the monitor's NVML readings (ops of process "monitor", f
"gpu"; see fixtures.gpu_telemetry).

- gpu_memory_back: after the load drained, each GPU's memory used is back
  near its baseline (its first reading of the run), within
  ``gpu_mem_slack_mb`` (default 1024 MiB): a co-tenant that outlived its
  heal, or an engine that kept what a fault made it take, shows here. No
  readings (a CPU cluster) or no drained reading: "unknown", and it says so.
"""

from __future__ import annotations

from typing import Any

from ordeal.history import MONITOR, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker


class GpuMemoryBack(StreamingChecker):
    name = "gpu_memory_back"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.slack_mb = float(ctx.extra.get("gpu_mem_slack_mb", 1024))
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
