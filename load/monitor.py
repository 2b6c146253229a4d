"""The monitor: samples every replica's /health, /metrics and process-tree
RSS through the run, into the history as ``info`` ops of process
"monitor", so checkers see them on the same clock as requests and faults.

A node that does not answer (killed, paused, hung) is a sample with an
``error``, never a crash of the harness. Samples are taken in a thread so a
hung endpoint never stalls the load; each request has a short timeout.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from invariants.node_health import KV_HELD_MAX, engine_left
from load.gpu_telemetry import GpuTelemetry
from load.metrics import MetricsParseError, parse_metrics
from nodes.process import group_members
from nodes.waits import http_get, read_within
from ordeal import procfs
from ordeal.history.ops import MONITOR
from ordeal.history.writer import History
from ordeal.journal import JournalTail, journal_path

#: How many more times the drain round asks a node that did not answer 200
#: (a second apart) before its sample stands: nodes_serve_at_end judges it.
DRAIN_RETRIES = 2


def group_rss_bytes(pgid: int | None, members: list[int] | None = None) -> int | None:
    """Resident memory of a node's whole process tree (API server, engine
    core, workers), from /proc: the process group ``pgid``, or the given
    ``members`` (a container's processes). None when none is left."""
    if pgid is None and members is None:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    members = group_members(pgid) if members is None else members
    for pid in members:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total if members else None


#: An engine's mapping of a node's raw Prometheus samples onto the common
#: metric names (``engines.base.Engine.collect_metrics``).
CommonMetrics = Callable[[Any, dict[str, float]], dict[str, float]]


def group_fds_threads(pgid: int | None,
                      members: list[int] | None = None) -> tuple[int, int] | None:
    """Open file descriptors and threads of a node's whole process tree, from
    /proc (as ``group_rss_bytes``): the figures a slow leak of sockets or
    threads shows in over hours. None when no member is left."""
    if pgid is None and members is None:
        return None
    fds = threads = 0
    members = group_members(pgid) if members is None else members
    seen = False
    for pid in members:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            n_fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Threads:"):
                threads += int(line.split()[1])
                break
        fds += n_fds
        seen = True
    return (fds, threads) if seen else None


def survivors(pgid: int | None) -> list[list[Any]]:
    """[pid, command line] of the processes still in a node's process group
    (a local node's group is its main process's pid) after that process
    ended: an engine whose API server died and did not notice."""
    if pgid is None:
        return []
    return [[pid, procfs.cmdline(pid)[:80]] for pid in group_members(pgid)]


def sample_node(node: Any, timeout: float = 2.0,
                common_metrics: CommonMetrics | None = None) -> dict[str, Any]:
    """One sample of a node. An engine whose health or metrics live elsewhere
    than vLLM's ``/health`` and ``/metrics`` (Triton: ``/v2/health/ready`` and
    a metrics port of its own) says so with ``health_url``/``metrics_url``.
    ``common_metrics`` adds the engine's figures under the common names."""
    url = node.endpoint.url
    health_url = getattr(node, "health_url", None) or f"{url}/health"
    metrics_url = getattr(node, "metrics_url", None) or f"{url}/metrics"
    value: dict[str, Any] = {"node": node.name, "pid": getattr(node, "pid", None)}
    try:
        status, _ = http_get(health_url, timeout=timeout,
                             context=getattr(node, "ssl_context", None))
        value["health"] = status
    except OSError as e:
        value["health"] = None
        value["error"] = f"/health: {type(e).__name__}: {e}"
        exit_code = getattr(node, "exit_code", None)  # a local node: did its process end?
        if callable(exit_code) and exit_code() is not None:
            value["exit_code"] = exit_code()
            # Its main process ended: what of its process group runs on
            # (no_orphans judges those that outlive the orphan bound).
            value["survivors"] = survivors(getattr(node, "pid", None))
        return value
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout,
                                    context=getattr(node, "ssl_context", None)) as resp:
            text = read_within(resp, 8 << 20, 2 * timeout).decode("utf-8", "replace")
            keep = getattr(node, "metrics_keep", None)  # an engine's own sample names
            value["metrics"] = parse_metrics(text, keep) if keep else parse_metrics(text)
            if common_metrics is not None:  # the engines' common names
                value["common"] = common_metrics(node, value["metrics"])
    except (OSError, MetricsParseError) as e:
        value["error"] = f"/metrics: {type(e).__name__}: {e}"
    # A container's processes are not one process group: ask the node.
    in_container = getattr(node, "container_id", None) is not None
    members = node.pids() if in_container else None
    value["rss_bytes"] = group_rss_bytes(getattr(node, "pid", None), members)
    counts = group_fds_threads(getattr(node, "pid", None), members)
    if counts is not None:
        value["fds"], value["threads"] = counts
    return value


def process_sample(node: Any) -> dict[str, Any] | None:
    """A node's process tree only (RSS, descriptors, threads), for a node
    whose health and metrics the monitor does not judge (the router): what
    a slow leak shows in over hours. None when it has no process here."""
    members = node.pids() if getattr(node, "container_id", None) is not None else None
    pid = getattr(node, "pid", None)
    rss = group_rss_bytes(pid, members)
    counts = group_fds_threads(pid, members)
    if rss is None or counts is None:
        return None
    return {"node": node.name, "pid": pid, "rss_bytes": rss, "fds": counts[0],
            "threads": counts[1]}


def node_journal(node: Any) -> Path | None:
    """Where a replica's request journal is: beside its log (a local node),
    or in the directory a container node writes it to (``journal_dir``)."""
    if getattr(node, "role", None) != "replica":
        return None
    directory = getattr(node, "journal_dir", None)
    if directory is None:
        process = getattr(node, "process", None)
        if process is None:
            return None
        directory = process.log_path.parent
    return journal_path(directory, node.name)


class Monitor:
    """Samples nodes (and, on a machine with NVIDIA GPUs, every GPU through
    NVML: ops f "gpu", one per GPU and round) into the history. ``gpu``: a
    GpuTelemetry to use, or None to open one (NVML once per monitor)."""

    def __init__(self, nodes: Sequence[Any], history: History, interval_s: float = 2.0,
                 gpu: GpuTelemetry | None = None, gpu_procs: bool = False,
                 common_metrics: CommonMetrics | None = None,
                 processes: Sequence[Any] = ()):
        self.nodes = list(nodes)
        # Nodes sampled for their process tree only (ops f "process"): the
        # router, whose memory and sockets the drift invariant watches.
        self.processes = list(processes)
        self.common_metrics = common_metrics
        self.history = history
        self.interval_s = interval_s
        self.gpu = gpu if gpu is not None else GpuTelemetry.open()
        self.gpu_procs = gpu_procs
        self._gpu_said = False
        self.journals = {n.name: JournalTail(p) for n in self.nodes
                         if (p := node_journal(n)) is not None}

    def read_journals(self) -> None:
        """Copy what each replica served since the last read into the
        history, one op per replica and read (process "monitor", f "served")."""
        for name, tail in self.journals.items():
            entries, begun, bad = tail.read_new()
            if entries or begun or bad:
                self.history.append("info", MONITOR, "served",
                                    {"node": name, "entries": entries, "begun": begun},
                                    "; ".join(bad[:3]) or None)

    async def sample_all(self, f: str = "sample") -> None:
        for node in self.nodes:
            value = await asyncio.to_thread(sample_node, node, 2.0, self.common_metrics)
            for _ in range(DRAIN_RETRIES if f == "drain" else 0):
                if value.get("health") == 200 or "exit_code" in value:
                    break
                await asyncio.sleep(1.0)  # a node busy for a moment is asked again
                value = await asyncio.to_thread(sample_node, node, 2.0, self.common_metrics)
            self.history.append("info", MONITOR, f, value, value.get("error"))
        for node in self.processes:
            value = await asyncio.to_thread(process_sample, node)
            if value is not None:
                self.history.append("info", MONITOR, "process", value)
        self.read_journals()
        await self.sample_gpus(f)

    async def wait_quiet(self, max_s: float, every_s: float = 0.25) -> float:
        """Wait, at most ``max_s``, until no node has a request running or
        waiting and none holds KV cache (what ``leak_bound`` judges in the
        drain round), asking their metrics every ``every_s`` without writing
        anything; returns the seconds waited. The drain round comes after it
        either way: a node still busy at ``max_s`` is judged as it is, as it
        was after the fixed wait this replaces. A node whose metrics do not
        say (another engine, no /metrics, down) does not hold the wait."""
        t0 = time.monotonic()
        while True:
            busy = False
            for node in self.nodes:
                value = await asyncio.to_thread(sample_node, node, 2.0, None)
                left, kv = engine_left(value.get("metrics") or {})
                if left > 0 or kv > KV_HELD_MAX:
                    busy = True
                    break
            waited = time.monotonic() - t0
            if not busy or waited + every_s > max_s:
                return waited
            await asyncio.sleep(every_s)

    async def sample_gpus(self, f: str = "sample") -> None:
        """One op per GPU (``phase`` is the round's kind: sample or drain).
        Without NVML, one op says so, once per monitor; not an error."""
        if not self.gpu.available:
            if not self._gpu_said:
                self._gpu_said = True
                self.history.append("info", MONITOR, "gpu", self.gpu.describe())
            return
        try:
            readings = await asyncio.to_thread(self.gpu.read, self.gpu_procs)
        except Exception as e:  # noqa: BLE001 - a broken reading must not end the run
            self.history.append("info", MONITOR, "gpu", {"phase": f},
                                f"NVML read failed: {type(e).__name__}: {e}")
            return
        for value in readings:
            self.history.append("info", MONITOR, "gpu", {"phase": f, **value})

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            t0 = time.monotonic()
            await self.sample_all()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))
