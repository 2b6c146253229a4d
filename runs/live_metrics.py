"""A run you can watch: OpenMetrics over HTTP while a run goes (issue 44),
for a Prometheus to scrape and a Grafana to draw
(docs/examples/grafana/ordeal-run.json).

The figures come from the run's own history, followed as the endurance
judge follows it (``HistoryTail``: the ops of each sealed chunk, verified),
so the endpoint shows what the verdict will read and adds nothing to the
load's hot path: requests by outcome, TTFT/TPOT/E2E histograms, the load's
schedule lag, fault windows open by kind and target, faults injected; each
invariant's latest state where a judge has one (the endurance judge's
interim, every check); the harness's RSS when scraped. The server is
prometheus_client's (``start_http_server``), on ``--metrics-host``
(default loopback) and ``--metrics-port``; it serves from the load's start
to the end of the run (``close``), one run at a time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ordeal import procfs
from ordeal.history.ops import HARNESS, Op
from ordeal.history.reader import HistoryTail
from ordeal.history.windows import CLOSED, INJECTED, OPENED, FaultWindows

#: Latency buckets in seconds: tiny CPU models answer in milliseconds, GPU
#: clusters' long streams take tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0)
#: How often the history is read (its writer seals a chunk every 0.5 s).
READ_EVERY_S = 1.0


class LiveMetrics:
    """The metrics of one run, fed from its history; ``start`` serves them."""

    def __init__(self, history_path: Path, run_id: str, suite: str):
        self.history_path = Path(history_path)
        self.registry = r = CollectorRegistry()
        Gauge("ordeal_run_info", "The run being watched (value 1)", ["run_id", "suite"],
              registry=r).labels(run_id, suite).set(1)
        self.ops = Counter("ordeal_history_ops", "Ops read from the run's history", registry=r)
        self.invoked = Counter("ordeal_requests_invoked", "Requests the load sent", registry=r)
        self.outcomes = Counter("ordeal_requests", "Requests ended, by outcome (ok, fail, info)",
                                ["outcome"], registry=r)
        self.ttft = Histogram("ordeal_ttft_seconds", "Time to first token of ok streams",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("ordeal_tpot_seconds", "Time per output token of ok streams",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("ordeal_e2e_seconds", "End-to-end latency of ok requests",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.lag = Histogram("ordeal_schedule_lag_seconds",
                             "How late each request was sent against the load's schedule",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.open_faults = Gauge("ordeal_fault_windows_open", "Fault windows open (1) or not "
                                 "(0), by kind and target", ["kind", "target"], registry=r)
        self.injected = Counter("ordeal_faults_injected", "Faults in place, by kind", ["kind"],
                                registry=r)
        self.invariants = Gauge("ordeal_invariant_valid", "Each invariant's latest state: 1 "
                                "held, 0 failed, -1 unknown", ["invariant"], registry=r)
        rss = Gauge("ordeal_harness_rss_bytes", "Resident memory of the harness", registry=r)
        rss.set_function(lambda: procfs.status_kb().get("VmRSS", 0) * 1024)
        self.windows = FaultWindows(keep=0)
        self.tail = HistoryTail(self.history_path, on_error=lambda _m: None,
                                on_note=lambda _m: None)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.address: tuple[str, int] | None = None

    # -- feeding ----------------------------------------------------------------
    def feed(self, op: Op) -> None:
        self.ops.inc()
        change = self.windows.feed(op)
        if change is not None:
            w = change.window
            if change.what == OPENED:
                self.open_faults.labels(w.kind, w.target).set(1)
            elif change.what == INJECTED:
                self.injected.labels(w.kind).inc()
            elif change.what == CLOSED:
                self.open_faults.labels(w.kind, w.target).set(0)
        if op.process in HARNESS:
            return
        v = op.value
        if op.type == "invoke":
            self.invoked.inc()
            if isinstance(v.get("lag_ms"), (int, float)):
                self.lag.observe(max(0.0, v["lag_ms"]) / 1000)
            return
        self.outcomes.labels(op.type).inc()
        if op.type != "ok":
            return
        for histogram, key in ((self.ttft, "ttft_ms"), (self.tpot, "tpot_ms"),
                               (self.e2e, "e2e_ms")):
            if isinstance(v.get(key), (int, float)):
                histogram.observe(v[key] / 1000)

    def set_invariants(self, results: Iterable[Any]) -> None:
        """Each invariant's state from results (``Result`` or their dicts)."""
        for res in results:
            name = res["name"] if isinstance(res, dict) else res.name
            valid = res["valid"] if isinstance(res, dict) else res.valid
            self.invariants.labels(name).set(1.0 if valid is True else
                                             0.0 if valid is False else -1.0)

    def read_new(self, final: bool = False) -> int:
        """Feed what the history sealed since the last read (``final``: its
        unsealed tail too, the writer being done)."""
        n = 0
        with self._lock:
            for op in (self.tail.read_rest() if final else self.tail.read_new()):
                self.feed(op)
                n += 1
        return n

    # -- serving ----------------------------------------------------------------
    def start(self, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
        """Serve on ``host``:``port`` (0: a free port) and follow the history."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.address = (host, self._server.server_address[1])
        self._thread = threading.Thread(target=self._loop, name="ordeal-metrics", daemon=True)
        self._thread.start()
        return self.address

    def _loop(self) -> None:
        while not self._halt.wait(READ_EVERY_S):
            try:
                self.read_new()
            except Exception:  # noqa: BLE001 - a figure is never worth the run
                pass

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
