"""The nodes of a Ray cluster of ours: ``RayNode``, one simulated Ray node
(a raylet and its workers in one process group and cgroup, what the Ray
node faults act on), and ``RayReplica``, one engine placed on one by its
actor, seen by the faults as any replica."""

from __future__ import annotations

import os
import signal as signals
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusters.ray_runtime import NODE_UP, RayError, check_loopback
from engines.vllm.nodes import (
    REPLICA_HINT,
    SERVED_MODEL_NAME,
    probe_vllm_fingerprint,
)
from nodes.process import ManagedProcess, group_members
from nodes.waits import http_get
from ordeal import procfs
from ordeal.topology import Endpoint, NodeNotReady

if TYPE_CHECKING:  # a type only: clusters.ray imports this module
    from clusters.ray import RayCluster


@dataclass(frozen=True)
class RayPorts:
    """The TCP ports one simulated Ray node listens on for Ray itself (GCS,
    raylet, object manager, agents) and the range its Ray workers, actors
    and drivers draw from. An engine's serving port is not among them."""

    ports: tuple[int, ...]
    workers: tuple[int, int]


class RayNode:
    """One simulated Ray node: a process group of its own (the launcher,
    gcs_server on the head, raylet, agents and Ray workers). Not a replica
    of the topology: node faults (faults/ray_node.py) target it; its
    ``engines()`` are the replicas Ray placed on it now."""

    def __init__(self, name: str, cluster: "RayCluster", argv: list[str], env: dict[str, str],
                 log_path: Path, resources: dict[str, float], head: bool = False,
                 ports: RayPorts | None = None, cgroup: str | None = None):
        self.name = name
        self.cluster = cluster
        self.head = head
        self.resources = resources
        self.ray_ports = ports
        #: The node's own cgroup v2 (a path under the root, as iptables'
        #: ``-m cgroup --path`` takes it), or None where cgroups cannot be
        #: made; ``cgroup_unavailable`` then says why.
        self.cgroup = cgroup
        self.cgroup_unavailable: str | None = None
        self.process = ManagedProcess(name, argv, env, log_path, cluster.cluster_id)
        self.node_id: str | None = None
        self.address: str | None = None
        self.ip: str | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_running(self) -> bool:
        """From /proc (leader alive, not a zombie), as for the engines:
        Popen.poll() is not trusted next to Ray's threads."""
        pid = self.process.pid
        if pid is None:
            return False
        self.process.is_running()  # reaps the leader when it can
        return procfs.state(pid) not in (None, "Z")

    def pids(self) -> list[int]:
        return group_members(self.process.pid) if self.process.pid else []

    def signal(self, signum: int) -> None:
        self.process.signal(signum)

    def declared_dead(self) -> bool:
        """Whether Ray's GCS has declared this node (its current node id)
        dead: final in Ray, the raylet exits once it hears so."""
        ray = sys.modules.get("ray")
        if ray is None or not self.node_id:
            return False
        try:
            nodes = ray.nodes()
        except Exception:  # noqa: BLE001 - no answer is no verdict
            return False
        return any(n.get("NodeID") == self.node_id and not n.get("Alive") for n in nodes)

    def engines(self) -> list["RayReplica"]:
        """Replicas whose actor runs on this node now (as last reported)."""
        return [r for r in self.cluster.replicas() if r.node_id and r.node_id == self.node_id]

    def engines_refreshed(self) -> list["RayReplica"]:
        """``engines()`` after asking each replica's actor where it runs
        (an actor that does not answer within 5 s keeps its last report)."""
        for r in self.cluster.replicas():
            try:
                r.refresh(timeout=5)
            except Exception:  # noqa: BLE001 - restarting, or its node is paused
                pass
        return self.engines()

    def start(self, timeout: float = 90.0) -> None:
        """Start (or restart) the node and wait until Ray counts it alive;
        a restarted node joins with a new node id. Each start gets socket
        names of its own: a killed raylet leaves its socket files behind."""
        argv = self.process.argv
        i = argv.index("--socket-prefix") + 1
        argv[i] = f"{argv[i].split('.')[0]}.{self.process.starts}"
        before = self.process.log_path.stat().st_size if self.process.log_path.exists() else 0
        if self.process.is_running() and not self.is_running():
            old = self.process  # Popen still says "running" for a dead leader: start afresh
            self.process = ManagedProcess(old.name, old.argv, old.env, old.log_path,
                                          old.cluster_id)
            self.process.starts = old.starts
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            with self.process.log_path.open("rb") as f:
                f.seek(before)  # this start's lines only
                text = f.read().decode("utf-8", "replace")
            m = NODE_UP.search(text)
            if m:
                self.address, self.node_id, self.ip = m.group(1), m.group(2), m.group(3)
                break
            if not self.is_running():
                raise RayError(f"Ray node {self.name} exited with code "
                               f"{self.process.exit_code()} before it was up. Last lines of "
                               f"{self.process.log_path}:\n" + "\n".join(self.log_tail(25))
                               + self.cluster.gcs_log_tail())
            if time.monotonic() > deadline:
                raise RayError(f"Ray node {self.name} not up after {timeout:.0f}s; last lines "
                               f"of {self.process.log_path}:\n" + "\n".join(self.log_tail(25))
                               + self.cluster.gcs_log_tail())
            time.sleep(0.2)
        check_loopback(f"Ray node {self.name}", [self.address, self.ip])

    def stop(self, grace: float = 10.0) -> None:
        self.process.stop(grace)

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.process.log_tail(lines)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "head": self.head, "node_id": self.node_id,
                "address": self.address or self.ip, "resources": self.resources,
                "cgroup": self.cgroup,
                "running": self.is_running(), "replicas": [r.name for r in self.engines()]}


# -- a replica the router sees ----------------------------------------------

class RayReplica:
    """A Node (ordeal.topology) whose engine process is owned by a Ray actor.

    Signals and process checks go to the engine's process group by its pid
    (the simulated nodes share this machine's pid space); start/stop go
    through the actor, so the engine is always (re)started where Ray put
    it."""

    role = "replica"

    def __init__(self, name: str, endpoint: Endpoint, log_path: Path, actor: Any,
                 clock_file: Path | None, timeout_s: float = 60.0):
        self.name = name
        self.endpoint = endpoint
        self.log_path = log_path
        self.journal_dir: Path | None = log_path.parent  # ORDEAL_LOG_DIR of the engine
        self.actor = actor
        self._clock_file = clock_file
        self.timeout_s = timeout_s
        self.info: dict[str, Any] = {}
        self._fingerprint: str | None = None
        self.served_model_name = SERVED_MODEL_NAME  # what the fingerprint probe asks for
        self.argv: list[str] = []  # the engine's command, for summary.json

    # what the actor last said
    @property
    def pid(self) -> int | None:
        return self.info.get("pid")

    @property
    def node_id(self) -> str | None:
        return self.info.get("node_id")

    @property
    def clock_file(self) -> Path | None:
        return self._clock_file

    def refresh(self, timeout: float | None = None) -> dict[str, Any]:
        import ray

        self.info = ray.get(self.actor.info.remote(), timeout=timeout or self.timeout_s)
        return self.info

    def is_running(self) -> bool:
        pid = self.pid
        return bool(pid) and procfs.start_time(pid) == self.info.get("start_time") \
            and procfs.state(pid) not in (None, "Z")

    def pids(self) -> list[int]:
        return group_members(self.pid) if self.is_running() and self.pid else []

    def signal(self, signum: int) -> None:
        if self.pid and self.is_running():
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    def start(self) -> None:
        import ray

        self.info = ray.get(self.actor.start_engine.remote(), timeout=self.timeout_s)

    def stop(self, grace: float = 10.0) -> None:
        import ray

        try:
            self.info = ray.get(self.actor.stop_engine.remote(grace), timeout=grace + 30)
        except Exception:  # noqa: BLE001 - actor or node gone: end the group here
            self.signal(signals.SIGKILL)
        if self.pid and group_members(self.pid):
            os.killpg(self.pid, signals.SIGKILL)

    def wait_ready(self, timeout: float) -> None:
        """Until the actor (wherever Ray placed or restarted it) reports a
        running engine and that engine answers /health 200. A dead actor
        or node is waited for: Ray reschedules it."""
        start = time.monotonic()
        last = "no answer yet"
        while True:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                raise NodeNotReady(
                    f"{self.name}: not ready within {timeout:.0f}s (Ray actor + vLLM /health at "
                    f"{self.endpoint.url}); last: {last}; actor info: {self.info}\nlast log "
                    "lines:\n" + "\n".join(self.log_tail(25)) + f"\nhint: {REPLICA_HINT}; "
                    "see `ray status` style detail in the cluster's ray-*.log files")
            try:
                self.refresh(timeout=min(10.0, max(1.0, left)))
                if not self.info.get("running"):
                    last = f"engine exited (actor starts: {self.info.get('starts')})"
                    raise NodeNotReady(f"{self.name}: engine exited before /health answered "
                                       f"200 (actor info: {self.info}).\nlast log lines:\n"
                                       + "\n".join(self.log_tail(30)) + f"\nhint: {REPLICA_HINT}")
                status, body = http_get(f"{self.endpoint.url}/health")
                if status == 200:
                    self._fingerprint = probe_vllm_fingerprint(self.endpoint.url,
                                                               model=self.served_model_name)
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except NodeNotReady:
                raise
            except Exception as e:  # noqa: BLE001 - actor restarting, engine loading
                last = f"{type(e).__name__}: {str(e)[:300]}"
            time.sleep(0.5)

    def fingerprint(self) -> str:
        return self._fingerprint or "unknown"

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            text = self.log_path.read_bytes()[-64 * 1024:].decode("utf-8", "replace")
        except OSError as e:
            return [f"(no log at {self.log_path}: {e})"]
        return text.splitlines()[-lines:]
