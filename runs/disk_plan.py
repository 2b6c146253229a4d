"""How much disk a run will write, planned before its load starts (issue 44).

A 72-hour run at a GPU cluster's rate writes tens of gigabytes of history;
finding the disk full on the second night loses the night. So every load
first estimates what it will write, from its workload and the cluster's size,
says it when it is large, records it in summary.json (``disk_plan``), and
refuses to start when the free space where the run writes is under
``FREE_FACTOR`` times the estimate, saying what to change. If the disk
fills all the same, the history's own handling stays (ordeal/history/writer.py:
the load stops, the faults heal, what was written is judged).

The figures per request are measured, not guessed: the histories of the
failure zoo's runs on this machine (2026-12-07, 2,569 answers of 19 tokens
on average, 2,814 invokes, 1,061 monitor ops over 491 s of two replicas and a
router) and the 2 h 45 min endurance example (7.1 KB a request for
200-400-token streams). Pure planning apart from ``free_bytes``.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from load.spec import WorkloadSpec
from ordeal.config import ConfigError

#: Bytes of the history per request: the invoke op, the answer op without
#: its per-token arrays, and per output token (its id, inter-token latency and
#: text piece in the answer).
INVOKE_BYTES = 380
ANSWER_BYTES = 430
BYTES_PER_TOKEN = 23
#: The monitor: a sample and a read of the served journal every 2 s per
#: replica, the router's process sample (about 700 bytes a second a node).
MONITOR_BYTES_PER_NODE_S = 700
#: The cluster's logs per request: the served journals' begin and end lines
#: (about 200 bytes) and the nodes' own log lines.
LOG_BYTES_PER_REQUEST = 250
#: Free space under this many times the estimate: the run does not start.
FREE_FACTOR = 2.0
#: Estimates from this size up are said at start (smaller ones only recorded).
SAY_FROM_BYTES = 100 * 2**20


def mean_output_tokens(spec: WorkloadSpec) -> float:
    """The workload's mean output length in tokens (a dataset gives prompts
    only): its ``output_tokens`` distribution's mean (or fixed value, or the
    middle of its clamp), else the middle of the uniform ``max_tokens``
    range. A distribution with neither mean nor upper clamp: its ``min``
    times 4."""
    d = spec.output_tokens
    if d is not None:
        if d.value is not None:
            return float(d.value)
        if d.mean is not None:
            return float(d.mean)
        if d.max is not None:
            return (d.min + d.max) / 2
        return float(d.min * 4)
    lo, hi = spec.max_tokens
    return (lo + hi) / 2


def planned_requests(spec: WorkloadSpec) -> int:
    """Requests the load will send: rate x duration in the open loop; closed,
    at most one a second per user (answers of the tiny CPU model take
    0.1-1 s; slower ones send fewer)."""
    if spec.mode == "closed":
        return int(spec.concurrency * spec.duration_s)
    return int(spec.rate * spec.duration_s)


def free_bytes(path: Path) -> int:
    """Free space for an unprivileged writer at ``path`` (or the nearest
    existing directory above it)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass(frozen=True)
class DiskPlan:
    path: str  # where the history goes (the run's directory)
    requests: int
    mean_output_tokens: float
    nodes: int
    duration_s: float
    history_bytes: int
    log_bytes: int
    free_bytes: int

    @property
    def need_bytes(self) -> int:
        return self.history_bytes + self.log_bytes

    @property
    def enough(self) -> bool:
        return self.free_bytes >= FREE_FACTOR * self.need_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "need_bytes": self.need_bytes, "free_factor": FREE_FACTOR,
                "enough": self.enough}

    def line(self) -> str:
        return (f"disk: this load will write about {_size(self.need_bytes)} (history "
                f"{_size(self.history_bytes)}, logs {_size(self.log_bytes)}: {self.requests:,} "
                f"requests of ~{self.mean_output_tokens:.0f} output tokens over "
                f"{self.duration_s / 3600:.1f} h); {_size(self.free_bytes)} free at {self.path}")

    def refusal(self) -> str:
        return (f"{self.line()}: under {FREE_FACTOR:g} x the estimate "
                f"({_size(int(FREE_FACTOR * self.need_bytes))}), so the run does not start. "
                "Free space there, put the runs on a larger disk (--runs-dir), or plan less: "
                "a shorter --duration/--load-duration, a lower --load-rate, shorter outputs")


def plan_disk(spec: WorkloadSpec, nodes: int, run_dir: Path,
              free: int | None = None) -> DiskPlan:
    """The plan for ``spec`` on a cluster of ``nodes`` nodes (replicas and
    router) writing into ``run_dir``; ``free``: the free bytes there (read
    from the file system when None)."""
    requests = planned_requests(spec)
    tokens = mean_output_tokens(spec)
    history = int(requests * (INVOKE_BYTES + ANSWER_BYTES + BYTES_PER_TOKEN * tokens)
                  + MONITOR_BYTES_PER_NODE_S * nodes * spec.duration_s)
    return DiskPlan(str(run_dir), requests, round(tokens, 1), nodes, spec.duration_s, history,
                    int(requests * LOG_BYTES_PER_REQUEST),
                    free_bytes(run_dir) if free is None else free)


def require_disk(plan: DiskPlan) -> None:
    """ConfigError with the plan and what to change when it does not fit."""
    if not plan.enough:
        raise ConfigError(plan.refusal())


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.1f} MB" if unit == "MB" else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
