"""One interface for every inference engine (vLLM, Triton), so that every
fault, workload and invariant works on either without asking which.

A backend (clusters.local) asks the engine for its nodes and its
router; the workload asks it for a client; the monitor asks it to map its
metrics onto common names; the run asks it for the checkers that apply and
for its own consistency check once the load is over. Adding an engine means
one package implementing ``Engine`` and a line in ``engines.registry.ENGINES``.

Common metric names (``collect_metrics``), so checkers and reports read
either engine the same way; a name an engine cannot give is left out:

  requests_running, requests_waiting   gauges, requests in the engine
  queue_time_s_total                   cumulative time requests queued
  success_total, failure_total         requests finished well / badly
  memory_used_bytes, kv_cache_usage    memory the engine holds (0..1 for KV)
  prompt_tokens_total, generation_tokens_total, inferences_total
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from invariants.base import Result
from load.client import EngineClient
from load.spec import WorkloadSpec
from nodes.local import LocalNode
from ordeal.history.ops import Op
from ordeal.topology import Endpoint

COMMON_METRICS = ("requests_running", "requests_waiting", "queue_time_s_total", "success_total",
                  "failure_total", "memory_used_bytes", "kv_cache_usage", "prompt_tokens_total",
                  "generation_tokens_total", "inferences_total")


@dataclass
class Upstream:
    """One port of a replica that the router forwards to (a fault-proxy link
    each): vLLM has one, Triton an HTTP and a gRPC port."""

    suffix: str  # link name = f"router-{replica}{suffix}"
    endpoint: Endpoint
    protocol: str = "http"


@dataclass
class ClientCounts:
    """What the client saw per history ``f`` and per serving node, for
    ``validate_consistency`` (filled from one pass over the history)."""

    by_f: dict[str, dict[str, int]] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)  # ok ops per node

    def add(self, op: Op, f: str) -> None:
        d = self.by_f.setdefault(f, {"ok": 0, "fail": 0, "info": 0, "model_error": 0})
        d[op.type] = d.get(op.type, 0) + 1
        if op.type == "fail" and str(op.value.get("status")) == "500":
            d["model_error"] += 1  # the model ran and answered an error
        node = op.value.get("node") if op.type == "ok" else None
        if node:
            self.by_node[node] = self.by_node.get(node, 0) + 1


class Engine(Protocol):
    name: str
    #: The model name a replica serves (the health probe asks /v1/models).
    served_model_name: str
    #: How every node's fingerprint begins (replicas, router): a real server
    #: said who it is, not a default.
    fingerprint_prefixes: tuple[str, ...]

    def answer_directly(self, node: Any, timeout: float = 30.0) -> dict[str, Any]:
        """One small request straight to ``node`` (not through the router):
        {"status", "node" (who answered), "tokens"}; raises OSError when it
        cannot answer."""

    def l7_visible(self, f: str) -> bool:
        """Whether requests of history ``f`` travel as HTTP/1.1 through the
        fault proxy, where its L7 toxics (http_fault) act."""

    def unsupported(self, kind: str) -> str | None:
        """Why this engine's nodes cannot take fault ``kind`` here (None:
        they can). Seen limits only, each with what was observed."""

    def lsn_jump_evidence(self, invariants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """From summary.json's invariants: the requests where an lsn_jump
        was caught (each with its ``wall``); empty when none was."""

    def prepare(self, cluster: Any) -> None:
        """Make what every node needs (a model, a model repository)."""

    def ports_per_replica(self) -> int: ...

    def replica(self, cluster: Any, index: int, ports: list[int]) -> LocalNode: ...

    def upstreams(self, node: LocalNode) -> list[Upstream]: ...

    def router(self, cluster: Any, endpoint: Endpoint,
               upstreams: list[tuple[str, Upstream, Endpoint]]) -> LocalNode:
        """The router, given (replica name, upstream, address to use)."""

    def client(self, spec: WorkloadSpec, entrypoint: str, cluster: Any) -> EngineClient: ...

    def checkers(self) -> list[Any]:
        """The streaming checkers that apply to this engine's history."""

    def collect_metrics(self, node: Any, raw: dict[str, float]) -> dict[str, float]:
        """Raw Prometheus samples of ``node`` -> the common names above."""

    def fingerprint(self, node: Any) -> str:
        """The engine's name and exact version (plus what identifies the model)."""

    def trace(self, op: Op, cluster: Any) -> dict[str, Any]:
        """The per-request timeline the engine can give for a completed op:
        queue, prefill / compute, decode, in ms, and where it came from."""

    def mark(self, cluster: Any) -> dict[str, Any]:
        """The engine's own counters before the load (a session's cluster
        serves several runs): what ``validate_consistency`` subtracts."""

    def validate_consistency(self, cluster: Any, counts: ClientCounts,
                             mark: dict[str, Any]) -> Result:
        """The engine's own records against what the client saw."""


def trace_files(path: Path) -> list[Path]:
    """Triton writes its trace as ``<file>.0``, ``<file>.1``, ... (log-frequency)
    and the last part as ``<file>`` itself."""
    return sorted(path.parent.glob(path.name + "*"))
