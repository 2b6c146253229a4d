"""What a cluster is, in terms every layer shares.

A backend (local processes today; Docker, Ray later) implements these
protocols. Faults act on nodes only through them, so no fault imports a
backend and a new backend brings every fault with it.

Vocabulary kept close to Kubernetes and Ray so those backends can follow:
a *service* is a set of replicas behind an address; a *node* is one replica
(or the router), with its own process tree and address.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, Sequence, runtime_checkable

Role = Literal["router", "replica"]

@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    scheme: str = "http"  # https: an external deployment's TLS entrypoint

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@runtime_checkable
class Node(Protocol):
    """One process tree the suite started and owns."""

    name: str
    role: Role
    endpoint: Endpoint

    def is_running(self) -> bool: ...

    def signal(self, signum: int) -> str | None:
        """Send ``signum`` to the node's whole process tree (and nothing else).
        Returns what the engine that carried it said when it did not simply
        succeed (a container engine's timeout, say), for the fault's record;
        None otherwise. The caller confirms the effect from the node's state."""

    def start(self) -> None:
        """(Re)start the node's processes; returns once they are spawned."""

    def wait_ready(self, timeout: float) -> None:
        """Block until the node serves; raise NodeNotReady with diagnostics."""

    def stop(self, grace: float = 10.0) -> None:
        """Stop the node's process tree: SIGTERM, then SIGKILL after ``grace``."""

    def fingerprint(self) -> str:
        """The engine's own identity string (e.g. vLLM's system_fingerprint)."""

    def log_tail(self, lines: int = 20) -> list[str]: ...

    def pids(self) -> list[int]:
        """Every live process of the node's tree (for cgroups, affinity,
        co-tenants). Empty when the node is not running."""

    @property
    def clock_file(self) -> Path | None:
        """The libfaketime control file the node was started with, or None
        when its clock cannot be moved (clock_drift then refuses, clearly)."""


@dataclass(frozen=True)
class Link:
    """One hop of traffic, e.g. ``client-router`` or ``router-replica-0``.

    ``listen`` is where the source connects (the fault proxy's listener);
    ``upstream`` is the destination's real endpoint; ``control`` is the fault
    proxy's control API. Link faults add toxics there, by link name.
    """

    name: str
    src: str
    dst: str
    listen: Endpoint
    upstream: Endpoint
    control: Endpoint
    #: The control API's dialect: "ordeal" (Ordeal's fault proxy, /links) or
    #: "toxiproxy" (a Toxiproxy server the user runs: /proxies), and the
    #: link's name there (a Toxiproxy proxy's; None: the link's own name).
    api: str = "ordeal"
    proxy: str | None = None


class NodeNotReady(RuntimeError):
    """A node did not become ready. The message carries what was waited for,
    the node's state, its last log lines and a hint, testcontainers-style.
    ``reason``: why the system under test said it failed, where its log
    said so in words the node's engine recognises (a vLLM replica that met
    a full device: ``engines/vllm/startup.py failure_reason``); None when
    no log line said why. A restart's judgement names it."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class Cluster(Protocol):
    backend: str
    engine: str
    nodes: Sequence[Node]

    @property
    def entrypoint(self) -> Endpoint:
        """Where clients send traffic (the router)."""

    def node(self, name: str) -> Node: ...

    def replicas(self) -> list[Node]: ...

    @property
    def links(self) -> Sequence[Link]:
        """Every proxied hop of the cluster (client-router, router-replica-i)."""

    def link(self, name: str) -> Link: ...
