"""One streaming pass over history.jsonl into what report.html draws.

Why a separate pass (not the checkers'): the report needs figures *over
time*, the checkers need verdicts. Memory is bounded whatever the run's
length: at most ``MAX_BUCKETS`` fixed-width time buckets (the width is
chosen from the run's duration in summary.json, and doubled by merging
neighbours if the history runs longer than the summary said), a reservoir
sample of latency points, and capped lists of fault windows, error kinds,
nodes and failure contexts. A 72-hour history therefore gives about the
same report size as a one-minute run.

Only whitelisted fields of an op are kept for the page (never request
headers or anything else a value might carry); strings are truncated here
and escaped when the page is written.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from invariants.histogram import LatencyHistogram
from invariants.requests import RequestPairer, Timeline
from invariants.settings import SLOTargets
from invariants.slo import figure, meets_slo
from ordeal.history.ops import MONITOR, NEMESIS, Op, stream_texts
from ordeal.history.reader import read_history
from ordeal.history.windows import CLOSED, OPENED, FaultWindows

MAX_BUCKETS = 600
NICE_WIDTHS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400)
CLOUD_POINTS = 1500  # reservoir size of the latency point cloud
MAX_ERROR_KINDS = 10  # more distinct kinds fold into "other"
MAX_NODES = 16
MAX_WINDOWS = 300  # fault windows kept for shading and the timeline
MAX_CONTEXTS = 25  # failures (and counterexamples) shown with the ops around them
CONTEXT_OPS = 4  # ops before and after each
TEXT_CAP = 240  # characters of model output / error kept per op
NODE_METRICS = {  # label -> where it is in a monitor sample
    "requests running": ("metrics", "vllm:num_requests_running"),
    "requests waiting": ("metrics", "vllm:num_requests_waiting"),
    "KV-cache use (%)": ("metrics", "vllm:kv_cache_usage_perc"),
    "RSS (bytes)": ("rss_bytes",),
}


def bucket_width_for(duration_s: float | None) -> float:
    """The smallest round width that fits the run into MAX_BUCKETS."""
    d = duration_s if duration_s and duration_s > 0 else 60.0
    for w in NICE_WIDTHS_S:
        if d / w <= MAX_BUCKETS:
            return float(w)
    return float(NICE_WIDTHS_S[-1] * (int(d / NICE_WIDTHS_S[-1] / MAX_BUCKETS) + 1))


def run_duration_s(summary: dict[str, Any]) -> float | None:
    """The run's length: summary ``duration_s`` (monotonic clock), else the
    difference of its wall times (older summaries; wrong if the clock was
    stepped during the run)."""
    d = summary.get("duration_s")
    if isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0:
        return float(d)
    try:
        t0 = datetime.fromisoformat(str(summary["started"]))
        t1 = datetime.fromisoformat(str(summary["ended"]))
        return max((t1 - t0).total_seconds(), 0.0)
    except (KeyError, ValueError, TypeError):
        return None


def error_kind(op: Op) -> str:
    """A short, stable class of failure: 'http 503', 'connection lost', ..."""
    status = op.value.get("status")
    if isinstance(status, int) and status >= 400:
        return f"http {status}"
    text = str(op.error or "no error text")
    return text.split(":", 1)[0].strip()[:40] or "no error text"


def output_text(value: dict[str, Any]) -> str:
    """The model's output as far as the history has it (streamed chunks or
    a text field), truncated. Untrusted: escaped when written."""
    stream = value.get("stream")
    if isinstance(stream, dict) and ("texts" in stream or "chunks" in stream):
        text = "".join(stream_texts(stream)[:200])
    else:
        text = str(value.get("text") or value.get("output") or "")
    return text[:TEXT_CAP]


def brief_op(op: Op) -> dict[str, Any]:
    """The fields of an op the page may show: a whitelist, so request
    headers or other secrets a value might carry never reach the report."""
    v = op.value
    out: dict[str, Any] = {"index": op.index, "wall": op.wall, "type": op.type,
                           "process": str(op.process), "f": op.f}
    for k in ("node", "status", "kind", "target", "phase", "request_id", "health",
              "finish_reason", "output_tokens", "e2e_ms", "ttft_ms"):
        if k in v and isinstance(v[k], (str, int, float, bool)):
            out[k] = v[k] if not isinstance(v[k], str) else v[k][:120]
    if op.error:
        out["error"] = str(op.error)[:TEXT_CAP]
    if op.process not in (MONITOR, NEMESIS):
        text = output_text(v)
        if text:
            out["output"] = text
        if op.type == "invoke" and isinstance(v.get("prompt"), str):
            out["prompt"] = v["prompt"][:TEXT_CAP]
    return out


@dataclass
class Bucket:
    ok: int = 0
    fail: int = 0
    info: int = 0
    good: int = 0  # ok and within every SLO target
    errors: Counter = field(default_factory=Counter)  # (type, kind) -> n
    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    itl: LatencyHistogram = field(default_factory=LatencyHistogram)
    e2e: LatencyHistogram = field(default_factory=LatencyHistogram)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> metric -> max
    health: dict[str, bool] = field(default_factory=dict)  # node -> every sample 200?

    def merge(self, o: Bucket) -> None:
        self.ok += o.ok
        self.fail += o.fail
        self.info += o.info
        self.good += o.good
        self.errors.update(o.errors)
        self.ttft.merge(o.ttft)
        self.itl.merge(o.itl)
        self.e2e.merge(o.e2e)
        for node, metrics in o.nodes.items():
            mine = self.nodes.setdefault(node, {})
            for k, val in metrics.items():
                mine[k] = max(mine.get(k, val), val)
        for node, ok in o.health.items():
            self.health[node] = self.health.get(node, True) and ok


@dataclass
class Context:
    """The ops around one failure or counterexample."""
    index: int
    why: str
    ops: list[dict[str, Any]]
    after_left: int = CONTEXT_OPS


@dataclass
class ReportData:
    width_s: float
    t0_ns: int | None = None
    last_ns: int | None = None
    buckets: dict[int, Bucket] = field(default_factory=dict)
    cloud: list[tuple[float, float, float | None, str]] = field(default_factory=list)
    seen_requests: int = 0
    windows: list[tuple[float, float | None, str]] = field(default_factory=list)  # s, s, label
    windows_dropped: int = 0
    # The warm-up (CheckerSettings.warmup_s): from the start (or a gap) to
    # warmup_s after the load's first request; s, s. Shaded like the windows.
    warmups: list[tuple[float, float]] = field(default_factory=list)
    error_kinds: set[str] = field(default_factory=set)
    nodes: list[str] = field(default_factory=list)
    gpu_keys: set[str] = field(default_factory=set)
    gpus: list[str] = field(default_factory=list)  # "gpu0"...: NVML readings (monitor f "gpu")
    gpu_note: str | None = None  # why there is no GPU telemetry, as the monitor said
    contexts: list[Context] = field(default_factory=list)
    ops_read: int = 0
    problems: list[str] = field(default_factory=list)  # damaged lines, read errors

    @property
    def span_s(self) -> float:
        if self.t0_ns is None or self.last_ns is None:
            return 0.0
        return (self.last_ns - self.t0_ns) / 1e9

    def t(self, ns: int) -> float:
        return (ns - (ns if self.t0_ns is None else self.t0_ns)) / 1e9


class Collector:
    """Feed ops in history order; ``data`` holds the aggregates."""

    def __init__(self, width_s: float, targets: SLOTargets, context_indexes: dict[int, str],
                 after_heal_s: float = 30.0, seed: int = 0, warmup_s: float = 0.0):
        self.data = ReportData(width_s)
        self.targets = targets
        self.timeline = Timeline(after_heal_s, warmup_s)
        self._warm_from: int | None = None  # where the current warm-up began (ns)
        self.pairer = RequestPairer(self.timeline)
        self.rng = random.Random(seed)
        self.wanted = dict(context_indexes)  # op index -> why (counterexamples)
        self.recent: deque[dict[str, Any]] = deque(maxlen=CONTEXT_OPS)
        self.open_contexts: list[Context] = []
        # The windows drawn: the first MAX_WINDOWS; a gap leaves them open.
        self.faults = FaultWindows(gaps=False, keep=MAX_WINDOWS)
        self._drawn: dict[str, int] = {}  # label -> index in data.windows, while open

    def bucket(self, ns: int) -> Bucket:
        d = self.data
        i = int(d.t(ns) // d.width_s)
        while i >= MAX_BUCKETS:  # longer than the summary said: coarsen
            self._coarsen()
            i = int(d.t(ns) // d.width_s)
        return d.buckets.setdefault(max(i, 0), Bucket())

    def _coarsen(self) -> None:
        d = self.data
        merged: dict[int, Bucket] = {}
        for i, b in sorted(d.buckets.items()):
            if i // 2 in merged:
                merged[i // 2].merge(b)
            else:
                merged[i // 2] = b
        d.buckets = merged
        d.width_s *= 2

    def feed(self, op: Op) -> None:
        d = self.data
        d.ops_read += 1
        if d.t0_ns is None:
            d.t0_ns = op.time_ns
        d.last_ns = op.time_ns if d.last_ns is None else max(d.last_ns, op.time_ns)
        self._contexts(op)
        if op.process == MONITOR:
            if op.f == "gap":  # the resumed load warms up again
                self.timeline.feed(op)
                self._warm_from = op.time_ns
            self._monitor(op)
            return
        if op.process == NEMESIS:
            self._nemesis(op)
        warm = self.timeline.warmup
        started = warm.load_start_ns
        req = self.pairer.feed(op)
        if (warm.end_ns is not None and warm.load_start_ns != started  # the load started
                and len(d.warmups) < MAX_WINDOWS):
            start = 0.0 if self._warm_from is None else d.t(self._warm_from)
            d.warmups.append((start, d.t(warm.end_ns)))
        if req is None or op.process == NEMESIS:
            return
        self._request(req)

    def _request(self, req: Any) -> None:
        d, done, v = self.data, req.done, req.done.value
        b = self.bucket(done.time_ns)
        if done.type == "ok":
            b.ok += 1
            b.good += meets_slo(req, self.targets)
        else:
            setattr(b, done.type, getattr(b, done.type) + 1)
            kind = error_kind(done)
            if kind not in d.error_kinds and len(d.error_kinds) >= MAX_ERROR_KINDS:
                kind = "other"
            d.error_kinds.add(kind)
            b.errors[(done.type, kind)] += 1
            if len(d.contexts) < MAX_CONTEXTS and done.index not in self.wanted:
                self._open_context(done, f"{done.type}: {kind}")
        if done.type != "ok":
            return
        at = self.bucket(req.invoke.time_ns)  # latency belongs to when it was asked
        # TTFT and E2E from the due time, as the checkers judge them
        ttft, e2e = figure(req, "ttft_ms"), figure(req, "e2e_ms")
        ttft = float(ttft) if isinstance(ttft, (int, float)) else None
        for value, hist in ((ttft, at.ttft), (e2e, at.e2e)):
            if isinstance(value, (int, float)):
                hist.add(float(value))
        if isinstance(v.get("itl_ms"), list):
            at.itl.extend(x for x in v["itl_ms"] if isinstance(x, (int, float)))
        if isinstance(e2e, (int, float)):
            point = (d.t(req.invoke.time_ns), float(e2e), ttft, done.type)
            d.seen_requests += 1
            if len(d.cloud) < CLOUD_POINTS:  # reservoir sampling (algorithm R)
                d.cloud.append(point)
            else:
                j = self.rng.randrange(d.seen_requests)
                if j < CLOUD_POINTS:
                    d.cloud[j] = point

    def _monitor(self, op: Op) -> None:
        if op.f == "gpu":
            self._gpu(op)
            return
        if op.f not in ("sample", "drain"):
            return
        d, v = self.data, op.value
        node = str(v.get("node", "?"))[:60]
        if node not in d.nodes:
            if len(d.nodes) >= MAX_NODES:
                return
            d.nodes.append(node)
        b = self.bucket(op.time_ns)
        b.health[node] = b.health.get(node, True) and v.get("health") == 200
        mine = b.nodes.setdefault(node, {})
        for label, path in NODE_METRICS.items():
            val: Any = v
            for k in path:
                val = val.get(k) if isinstance(val, dict) else None
            if isinstance(val, (int, float)):
                val = float(val) * (100 if label.startswith("KV") else 1)
                mine[label] = max(mine.get(label, val), val)
        gpu = v.get("gpu")  # GPU telemetry, where a sample carries it
        if isinstance(gpu, dict):
            for k, val in list(gpu.items())[:12]:
                if isinstance(val, (int, float)) and not isinstance(val, bool):
                    key = f"gpu {str(k)[:40]}"
                    d.gpu_keys.add(key)
                    mine[key] = max(mine.get(key, float(val)), float(val))

    def _gpu(self, op: Op) -> None:
        """An NVML reading of one GPU (load.gpu_telemetry), drawn as a
        series "gpuN" beside the nodes; or the one note that there is none."""
        d, v = self.data, op.value
        gpu = v.get("gpu")
        if not isinstance(gpu, dict):
            if v.get("available") is False and d.gpu_note is None:
                d.gpu_note = str(v.get("reason", ""))[:300]
            return
        label = f"gpu{v.get('device', '?')}"[:20]
        if label not in d.gpus:
            if len(d.gpus) >= MAX_NODES:
                return
            d.gpus.append(label)
        mine = self.bucket(op.time_ns).nodes.setdefault(label, {})
        for k, val in list(gpu.items())[:12]:
            if isinstance(val, (int, float)) and not isinstance(val, bool) and val >= 0:
                key = f"gpu {str(k)[:40]}"
                d.gpu_keys.add(key)
                # clocks: the lowest in a bucket is the throttle; the rest: the highest
                pick = min if k.endswith("clock_mhz") else max
                mine[key] = pick(mine.get(key, float(val)), float(val))

    def _nemesis(self, op: Op) -> None:
        change = self.faults.feed(op)
        if change is None:
            return
        d, w = self.data, change.window
        if change.what == OPENED:
            d.windows_dropped = self.faults.dropped
            if len(self.faults.windows) > len(d.windows):  # kept: drawn
                self._drawn[w.label] = len(d.windows)
                d.windows.append((d.t(w.start_ns), None, w.key))
        elif change.what == CLOSED and w.label in self._drawn:
            i = self._drawn.pop(w.label)
            start, _, key = d.windows[i]
            d.windows[i] = (start, d.t(op.time_ns), key)

    def _open_context(self, op: Op, why: str) -> None:
        before = [r for r in self.recent if r["index"] != op.index]
        ctx = Context(op.index, why, before + [dict(brief_op(op), focus=True)])
        self.data.contexts.append(ctx)
        self.open_contexts.append(ctx)

    def _contexts(self, op: Op) -> None:
        if self.open_contexts:
            brief = brief_op(op)
            for ctx in self.open_contexts:
                ctx.ops.append(brief)
                ctx.after_left -= 1
            self.open_contexts = [c for c in self.open_contexts if c.after_left > 0]
        if op.index in self.wanted:
            self._open_context(op, self.wanted.pop(op.index))
        self.recent.append(brief_op(op))


def counterexample_indexes(summary: dict[str, Any]) -> dict[int, str]:
    """op index -> "invariant: problem" for the first counterexamples."""
    out: dict[int, str] = {}
    for inv in summary.get("invariants") or []:
        if not isinstance(inv, dict):
            continue
        for cx in (inv.get("counterexamples") or [])[:5]:
            if (isinstance(cx, dict) and isinstance(cx.get("index"), int)
                    and len(out) < MAX_CONTEXTS):
                out.setdefault(cx["index"], f"{inv.get('name')}: {cx.get('problem', '')}"[:200])
    return out


def slo_targets(summary: dict[str, Any]) -> SLOTargets:
    """The targets the run was judged by (from slo_latency's details)."""
    for inv in summary.get("invariants") or []:
        if isinstance(inv, dict) and inv.get("name") == "slo_latency":
            t = (inv.get("details") or {}).get("targets") or {}
            try:
                return SLOTargets(**{k: float(t[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")
                                     if k in t})
            except (TypeError, ValueError):
                break
    return SLOTargets()


def warmup_of(summary: dict[str, Any]) -> float:
    """The warm-up the run was judged with (summary ``settings.warmup_s``;
    0 for a summary without it)."""
    settings = summary.get("settings")
    w = settings.get("warmup_s") if isinstance(settings, dict) else None
    return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 else 0.0


def collect(history: Path, summary: dict[str, Any]) -> ReportData:
    """Read the whole history once. Never raises: damaged lines and read
    errors go to ``problems`` and what was read so far is kept."""
    width = bucket_width_for(run_duration_s(summary))
    col = Collector(width, slo_targets(summary), counterexample_indexes(summary),
                    warmup_s=warmup_of(summary))
    problems: list[str] = []
    try:
        for op in read_history(history, on_error=problems.append):
            col.feed(op)
    except Exception as e:  # noqa: BLE001 - the report shows what it could read
        problems.append(f"reading {history.name} stopped after {col.data.ops_read} ops: "
                        f"{type(e).__name__}: {e}")
    data = col.data
    data.problems = problems[:50] + ([f"... and {len(problems) - 50} more damaged lines"]
                                     if len(problems) > 50 else [])
    return data
