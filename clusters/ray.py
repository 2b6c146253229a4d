"""``--cluster ray``: the same topology (a router in front of N real vLLM
replicas, the fault proxy on every link), with the replicas placed by a Ray
cluster onto its nodes.

Shape, and why:

- Ray places, the engine stays real. Each replica is a detached, named Ray
  actor (``ReplicaActor``, ``max_restarts=-1``) that spawns the real vLLM
  API server (the same argv and environment as ``VllmReplica``) as a
  labelled ManagedProcess and reports its pid. When a node dies, Ray
  restarts the actor on another node and the actor starts the engine again:
  the engine is rescheduled by Ray, not by Ordeal. Ray Serve was not used:
  it would put its own proxy in front of vLLM's HTTP server and own the
  process in a way the process faults (kill, pause, clock) cannot reach.
- Simulated nodes: ``--cluster ray`` starts a head (no replica goes there)
  and ``--ray-nodes`` worker nodes on this machine, each one process tree
  of its own (``python -m clusters.ray_node_main``: gcs/raylet/agents/
  workers in one labelled process group). Worker node i carries the custom
  resource ``ordeal-node-i``; replica i prefers node i (soft node
  affinity) and may run on any node with a free ``ordeal-slot``, so losing
  a node moves its replica.
- Addresses: every Ray address is 127.0.0.1 and checked after start (Ray
  otherwise advertises the machine's external address; see
  ``ray_node_main``). ``--ray-address`` joins an existing cluster only when
  its address and every node's address are loopback or a network named
  with ``--allow-target``.
- The router and the fault proxy stay local processes, as in LocalCluster,
  so every link fault works unchanged. Replica ports are fixed per replica
  (chosen here), so a rescheduled replica is found at the same address.

Node-level faults (``faults/ray_node.py``) act on ``cluster.ray_nodes``
(``RayNode``): lose a node (SIGKILL its process group and the engines Ray
placed on it), pause it (SIGSTOP the same). Leftovers of a crashed harness
are ended by their process records (``ordeal.ownership.reap_leftovers``, at
every suite start and by ``python -m faults heal-all``), its temp dir and
cgroups by ``faults.ray_node.remove_leftovers``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal as signals
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clusters.base import HostFrontCluster
from engines.registry import engine_for
from engines.vllm.adapter import prepare_model
from engines.vllm.model import TinyModel
from engines.vllm.nodes import (
    REPLICA_HINT,
    REPO_ROOT,
    SERVED_MODEL_NAME,
    ReplicaConfig,
    probe_vllm_fingerprint,
    replica_argv,
    replica_env,
)
from faults.ray_node import RAY_OWNER_FILE, RAY_TEMP_PREFIX
from load.workers import START_TIMEOUT_S, SocketWorkers, WorkerJob, connect_and_run
from nodes.ports import free_ports
from nodes.process import ManagedProcess, group_members
from nodes.waits import http_get
from ordeal import cgroup2, procfs
from ordeal.config import ClusterSpec, state_dir
from ordeal.ownership import SESSION_NETWORKS, NotOurs, Owner
from ordeal.topology import Endpoint, NodeNotReady

Progress = Callable[[str], None]

#: Every Ray temp dir the suite creates is /tmp/<RAY_TEMP_PREFIX><id>, with
#: a marker (RAY_OWNER_FILE: the owner's label, then the cluster id), so
#: heal-all removes only ours, and only when its harness is gone.
TEMP_ROOT = Path("/tmp")
#: The environment every process of a Ray cluster of ours carries.
BACKEND_LABEL = "ORDEAL_BACKEND"
_UP = re.compile(r"^ORDEAL_RAY_NODE_UP address=(\S+) node_id=(\w+) ip=(\S+)$", re.M)


class RayError(RuntimeError):
    """The Ray cluster could not start, be joined, or place a replica; the
    message says what was wrong and what to do."""


def ray_module() -> Any:
    """Import Ray for a driver that talks to loopback only. Ray resolves
    127.0.0.1 to the machine's external address unless this variable is 0
    (read once, at import), so it is set first."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
        from ray._private import ray_constants
    except ImportError:
        raise RayError("Ray is not installed in this environment: "
                       ".venv/bin/python -m pip install 'ray[serve]==2.60.0' "
                       "(the `ray` extra)") from None
    ray_constants.ENABLE_RAY_CLUSTER = False  # also when Ray was imported earlier
    return ray


def unavailable_reason() -> str | None:
    """Why the ray backend cannot run here (for a skip that says so)."""
    try:
        ray_module()
    except RayError as e:
        return str(e)
    return None


# -- the actor that owns one engine ---------------------------------------

class ReplicaActor:
    """Runs inside a Ray worker on the node Ray chose. Starts the real vLLM
    API server as a labelled process group (ManagedProcess), whose record
    names the *harness* as owner, so a crashed harness's engines are ended
    by ``ordeal.ownership.reap_leftovers`` like every other node's. Ray
    restarts this actor on another node when its node dies; ``__init__``
    then starts the engine there."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.proc: ManagedProcess | None = None
        self.starts = 0
        self.start_engine()

    def _engine_alive(self) -> bool:
        """The engine's leader runs (not a zombie), from /proc. Popen.poll()
        in this Ray worker kept answering "running" for an engine that
        process_kill had SIGKILLed (seen twice in three runs), so a restart
        was refused with "already running"."""
        if self.proc is None or self.proc.pid is None:
            return False
        if self.proc.proc is not None:
            self.proc.proc.poll()  # reap it if we can
        return procfs.state(self.proc.pid) not in (None, "Z")

    def start_engine(self) -> dict[str, Any]:
        s = self.spec
        if self._engine_alive():
            return self.info()
        if self.proc is not None and group_members(self.proc.pid or 0):
            # Killed leader, children left (EngineCore dies a moment later).
            os.killpg(self.proc.pid, signals.SIGKILL)
        config = s.get("config") or ReplicaConfig()
        env = replica_env(dict(os.environ), s["cpu_core"],
                          Path(s["clock_file"]) if s["clock_file"] else None, config)
        env[BACKEND_LABEL] = "ray"
        argv = replica_argv(sys.executable, Path(s["model_dir"]), s["host"], s["port"], config)
        # A new ManagedProcess per start (see _engine_alive); the log banner
        # counts this actor's starts.
        self.proc = ManagedProcess(s["name"], argv, env, Path(s["log_path"]), s["cluster_id"],
                                   owner=s["owner"])
        self.proc.starts = self.starts
        self.starts += 1
        self.proc.start()
        return self.info()

    def info(self) -> dict[str, Any]:
        import ray

        pid = self.proc.pid if self.proc else None
        return {"pid": pid, "start_time": procfs.start_time(pid) if pid else None,
                "running": self._engine_alive(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid(), "starts": self.starts}

    def stop_engine(self, grace: float = 10.0) -> dict[str, Any]:
        if self.proc is not None:
            self.proc.stop(grace)
        return self.info()


# -- the simulated Ray nodes ------------------------------------------------

# -- load workers as actors on the Ray nodes ---------------------------------

class LoadWorkerActor:
    """One load worker (load/workers.py) in a Ray worker process on the
    node Ray chose: it dials the harness (``SocketWorkers``) and runs its
    share of the plan there, so the load grows with the Ray cluster."""

    def node(self) -> tuple[str, int]:
        ray = ray_module()
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self, address: tuple[str, int], key: bytes, job: WorkerJob) -> None:
        connect_and_run(address, key, job)


class _ActorHandle:
    """A load worker actor, as load.workers.WorkerPool sees a worker."""

    def __init__(self, ray: Any, actor: Any, name: str):
        self.ray, self.actor, self.name = ray, actor, name
        self.ref: Any = None  # the run() task
        self.ready: tuple[Any, ...] | None = None

    def exited(self) -> str | None:
        if self.ref is None:
            return None
        done, _ = self.ray.wait([self.ref], timeout=0)
        if not done:
            return None
        try:
            self.ray.get(self.ref, timeout=0)
            return f"actor {self.name} returned"
        except Exception as e:  # noqa: BLE001 - how it ended is the answer
            return f"actor {self.name} failed: {type(e).__name__}: {str(e)[:300]}"

    def end(self, grace_s: float = 5.0) -> None:
        """Let its run() return (the worker said done), then end the actor:
        ours, by its handle."""
        if self.ref is not None:
            self.ray.wait([self.ref], timeout=grace_s)
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


class RayLoadLauncher:
    """``--load-workers N`` on ``--cluster ray``: each worker a Ray actor,
    spread over the Ray nodes that run replicas (worker *i* on node *i* mod
    the nodes, by a sliver of that node's ``ordeal-node-i`` resource; on a
    cluster Ordeal joined, a soft affinity to its alive nodes), dialling
    back to this process over TCP. On this machine the nodes share its cores; on a
    real cluster each node brings its own (docs/ray.md)."""

    what = "Ray actors"

    def __init__(self, cluster: "RayCluster"):
        self.cluster = cluster
        self.listener: SocketWorkers | None = None
        self.placed: list[str] = []  # the Ray node each worker ran on

    def launch(self, jobs: list[WorkerJob]) -> list[tuple[Any, Any]]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = ray_module()
        self.listener = SocketWorkers(self.cluster.spec.host)
        actor_cls = ray.remote(LoadWorkerActor)
        handles: list[_ActorHandle] = []
        nodes = self.cluster.ray_nodes
        try:
            for job in jobs:
                name = f"{self.cluster.cluster_id}-load-{job.rid_prefix}-{job.index}"
                if nodes and not self.cluster.joined:
                    # A sliver of the node's own resource: Ray must put it
                    # there (a soft node affinity alone was not kept: seen
                    # 2026-12-05, both workers off their nodes).
                    where: dict[str, Any] = {"resources": {
                        f"ordeal-node-{job.index % len(nodes)}": 0.001}}
                else:  # a cluster Ordeal joined: spread over its alive nodes
                    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
                    where = {"scheduling_strategy": NodeAffinitySchedulingStrategy(
                        alive[job.index % len(alive)], soft=True)}
                actor = actor_cls.options(name=name, num_cpus=0, max_restarts=0,
                                          max_task_retries=0, **where).remote()
                handles.append(_ActorHandle(ray, actor, name))
            placed = ray.get([h.actor.node.remote() for h in handles], timeout=START_TIMEOUT_S)
            names = {n.node_id: n.name for n in nodes}
            self.placed = [names.get(node_id, node_id[:12]) for node_id, _pid in placed]
            for h, job in zip(handles, jobs):
                h.ref = h.actor.run.remote(self.listener.address, self.listener.key, job)
            conns = self.listener.accept(
                len(jobs), START_TIMEOUT_S,
                alive=lambda: next((g for g in (h.exited() for h in handles) if g), None))
        except BaseException:
            for h in handles:
                h.end(grace_s=0)
            self.close()
            raise
        out = []
        for h, job in zip(handles, jobs):
            h.ready = conns[job.index][1]
            out.append((h, conns[job.index][0]))
        self.cluster.progress(f"load: {len(jobs)} load worker actor(s) on "
                              + ", ".join(self.placed))
        return out

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


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
            m = _UP.search(text)
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


def check_loopback(what: str, addresses: list[str | None]) -> None:
    """Every Ray address must be ours (loopback, or a network named with
    --allow-target); anything else is refused with what to do."""
    for addr in addresses:
        if not addr:
            continue
        host, _, port = addr.rpartition(":") if addr.count(":") == 1 else (addr, "", "0")
        try:
            SESSION_NETWORKS.require_ours(Endpoint(host, int(port or 0)), what)
        except NotOurs as e:
            raise RayError(f"{what}: address {addr} is not allowed: {e}") from None


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


# -- the cluster --------------------------------------------------------------

class RayCluster(HostFrontCluster):
    backend = "ray"
    engine = "vllm"

    def __init__(self, spec: ClusterSpec, cluster_id: str, log_dir: Path,
                 progress: Progress = print, model: TinyModel | None = None):
        super().__init__(spec, cluster_id, log_dir, progress, model)
        self.head: RayNode | None = None
        self.ray_nodes: list[RayNode] = []  # worker nodes (replicas go there)
        self.address: str | None = None
        self.namespace = f"ordeal-{uuid.uuid4().hex[:8]}"
        self.temp_dir: Path | None = None
        self.joined = spec.ray_address is not None
        self.engine_adapter = engine_for(self.engine, self.spec)  # the router, the upstreams
        self._connected = False
        self._actors: list[Any] = []

    def _describe_extra(self) -> dict[str, Any]:
        ray = sys.modules.get("ray")
        return {"ray": {"address": self.address, "namespace": self.namespace,
                        "version": getattr(ray, "__version__", None),
                        "joined": self.joined,
                        "nodes": [n.describe() for n in
                                  ([self.head] if self.head else []) + self.ray_nodes]}}

    def _node_extra(self, node: Any) -> dict[str, Any]:
        if isinstance(node, RayReplica):
            placed = self.ray_node_of(node)
            return {"ray_node": placed.name if placed else None,
                    "ray_node_id": (node.node_id or "")[:12]}
        return {}

    def load_worker_launcher(self) -> RayLoadLauncher:
        """Where ``--load-workers`` run on this backend: actors on the Ray
        nodes (load.workers.WorkerLauncher)."""
        return RayLoadLauncher(self)

    def ray_node_of(self, replica: RayReplica) -> RayNode | None:
        for n in self.ray_nodes:
            if n.node_id and n.node_id == replica.node_id:
                return n
        return None

    def ray_node(self, name: str) -> RayNode:
        for n in ([self.head] if self.head else []) + self.ray_nodes:
            if n.name == name:
                return n
        raise KeyError(f"no Ray node {name!r}; Ray nodes: {[n.name for n in self.ray_nodes]}")

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "RayCluster":
        t0 = time.monotonic()
        ray = ray_module()
        if self.model is None:
            self.model = prepare_model(self.spec, self.progress)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.joined:
            self.address = self.spec.ray_address
            check_loopback("--ray-address", [self.address])
        else:
            self._start_ray_nodes()
        try:
            ray.init(address=self.address, namespace=self.namespace, log_to_driver=False,
                     logging_level="warning")
        except Exception as e:  # noqa: BLE001 - Ray's own message is the useful part
            raise RayError(f"cannot connect to the Ray cluster at {self.address}: "
                           f"{type(e).__name__}: {e}. Is it running (`ray status --address "
                           f"{self.address}`)?") from None
        self._connected = True
        alive = [n for n in ray.nodes() if n.get("Alive")]
        check_loopback("Ray cluster node", [n.get("NodeManagerAddress") for n in alive])
        if self.joined:
            self.progress(f"joined the Ray cluster at {self.address}: {len(alive)} node(s)")
        self._place_replicas(ray, alive)
        replicas = self.replicas()
        self._wait_all(replicas)
        self._start_front(replicas)
        placed = ", ".join(f"{r.name} on {getattr(self.ray_node_of(r), 'name', r.node_id)}"
                           for r in replicas)
        self.ready(t0, f"router at {self.router.endpoint.url}; {placed}")
        return self

    def _node_argv(self, head: bool, socket_prefix: str, resources: dict[str, float],
                   cgroup_dir: Path | None = None) -> tuple[list[str], int | None, RayPorts]:
        names = ["node_manager", "object_manager", "dashboard_agent_listen", "metrics_agent",
                 "runtime_env_agent", "metrics_export"]
        if head:
            names += ["ray_client_server", "dashboard"]
        ports = free_ports(len(names) + (1 if head else 0), "127.0.0.1")
        port_map = dict(zip(names, ports))
        worker_ports = _free_range(24)
        argv = [sys.executable, "-m", "clusters.ray_node_main", "--temp-dir", str(self.temp_dir),
                "--socket-prefix", socket_prefix, "--resources", json.dumps(resources),
                "--min-worker-port", str(worker_ports[0]),
                "--max-worker-port", str(worker_ports[-1]), "--ports", json.dumps(port_map)]
        gcs_port = ports[-1] if head else None
        argv += ["--head", "--port", str(gcs_port)] if head else ["--address", str(self.address)]
        if cgroup_dir is not None:
            argv += ["--cgroup", str(cgroup_dir)]
        return argv, gcs_port, RayPorts(tuple(ports), (worker_ports[0], worker_ports[-1]))

    def _node_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
            BACKEND_LABEL: "ray",
            # Declare a lost node dead in ~3 s instead of ~30 s (Ray's
            # defaults), so a short run sees the reschedule.
            "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
            "ORDEAL_STATE_DIR": str(state_dir()),
        })
        return env

    def _start_ray_nodes(self) -> None:
        """A head (GCS, no replica) and ``spec.ray_nodes`` worker nodes, one
        after the other: each joins the head and is up before the next."""
        self.temp_dir = TEMP_ROOT / f"{RAY_TEMP_PREFIX}{uuid.uuid4().hex[:8]}"  # short: sockets
        self.temp_dir.mkdir(mode=0o700)
        (self.temp_dir / RAY_OWNER_FILE).write_text(
            f"{Owner.current().label()}\n{self.cluster_id}\n")
        env = self._node_env()
        argv, gcs_port, ports = self._node_argv(True, "h", {"ordeal-head": 1})
        self.address = f"127.0.0.1:{gcs_port}"
        self.head = RayNode("ray-head", self, argv, env, self.log_dir / "ray-head.log",
                            {"ordeal-head": 1}, head=True, ports=ports)
        n_nodes = self.spec.ray_nodes or max(2, self.spec.replicas)
        self.progress(f"starting a Ray head at {self.address} and {n_nodes} "
                      f"simulated node(s); Ray temp dir {self.temp_dir}")
        self.head.start()
        slots = float(self.spec.replicas)  # any node can take every replica: a lost one moves
        for i in range(n_nodes):
            res = {f"ordeal-node-{i}": 1.0, "ordeal-slot": slots}
            cgroup, cgroup_dir, why_not = self._node_cgroup(f"ray-node-{i}")
            argv, _, ports = self._node_argv(False, f"n{i}", res, cgroup_dir)
            node = RayNode(f"ray-node-{i}", self, argv, env, self.log_dir / f"ray-node-{i}.log",
                           res, ports=ports, cgroup=cgroup)
            node.cgroup_unavailable = why_not
            self.ray_nodes.append(node)
            node.start()
            self.progress(f"{node.name} up (node id {node.node_id[:12] if node.node_id else '?'})")

    def _node_cgroup(self, name: str) -> tuple[str | None, Path | None, str | None]:
        """(path for iptables, directory, why not) of a worker node's own
        cgroup, ``/ordeal-ray-<id>/<node>``, named like the Ray temp dir so
        that heal-all can tell a dead harness's leftovers by its marker.
        Without cgroup v2 or root the node runs where the harness runs and
        only ``ray_node_partition`` is refused."""
        why_not = cgroup2.unavailable_reason()
        if why_not is not None or self.temp_dir is None:
            return None, None, why_not or "no Ray temp dir"
        rel = f"/{self.temp_dir.name}/{name}"
        try:
            return rel, cgroup2.make(rel), None
        except OSError as e:
            return None, None, f"cannot make cgroup {rel}: {e}"

    def _place_replicas(self, ray: Any, alive: list[dict[str, Any]]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.joined:
            targets = [n["NodeID"] for n in alive if n.get("Resources", {}).get("CPU", 0) > 0] \
                or [n["NodeID"] for n in alive]
            need = {"num_cpus": 0}
        else:
            targets = [n.node_id for n in self.ray_nodes]
            need = {"num_cpus": 0, "resources": {"ordeal-slot": 1}}
        if not targets:
            raise RayError(f"the Ray cluster at {self.address} has no node to place replicas on")
        actor_cls = ray.remote(ReplicaActor)
        host = self.spec.host
        ports = free_ports(self.spec.replicas, host)
        cores = sorted(os.sched_getaffinity(0))
        owner = Owner.current()
        for i in range(self.spec.replicas):
            name = f"replica-{i}"
            clock = (self.log_dir / f"{name}.faketime") if self.spec.clock_faults else None
            spec = {"name": name, "cluster_id": self.cluster_id,
                    "model_dir": str(self.model.path),
                    "host": host, "port": ports[i], "cpu_core": cores[i % len(cores)],
                    "clock_file": str(clock) if clock else None,
                    "log_path": str(self.log_dir / f"{name}.log"),
                    "owner": owner, "config": ReplicaConfig.of(self.spec)}
            actor = actor_cls.options(
                name=f"{self.cluster_id}-{name}", lifetime="detached", max_restarts=-1,
                max_task_retries=0, max_concurrency=4, **need,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    targets[i % len(targets)], soft=True),
            ).remote(spec)
            self._actors.append(actor)
            node = RayReplica(name, Endpoint(host, ports[i]), self.log_dir / f"{name}.log",
                              actor, clock)
            node.served_model_name = spec["config"].served_model_name
            # The actor builds the same command from the same inputs (the
            # actor's interpreter is this one: the Ray nodes run it).
            node.argv = replica_argv(sys.executable, self.model.path, host, ports[i],
                                     spec["config"])
            self.nodes.append(node)
        self.progress(f"placed {self.spec.replicas} replica actor(s) on "
                      f"{len(targets)} Ray node(s); vLLM ports "
                      f"{[r.endpoint.port for r in self.replicas()]}; logs in {self.log_dir}")

    def _ready_note(self, node: Any) -> str:
        where = self.ray_node_of(node)
        return (f"{node.name} ready on {where.name if where else node.node_id} "
                f"({node.fingerprint()})")

    def wait_rescheduled(self, replica: RayReplica, away_from: str | None,
                         timeout: float) -> float:
        """Seconds until ``replica``'s actor runs on a node other than
        ``away_from`` (a node id) and its engine serves again."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            try:
                replica.refresh(timeout=5)
                if replica.node_id != away_from and replica.info.get("running"):
                    break
            except Exception:  # noqa: BLE001 - the actor is being restarted
                pass
            if time.monotonic() > deadline:
                raise NodeNotReady(f"{replica.name}: not rescheduled away from node "
                                   f"{(away_from or '?')[:12]} within {timeout:.0f}s")
            time.sleep(0.5)
        replica.wait_ready(max(1.0, deadline - time.monotonic()))
        return time.monotonic() - t0

    def stop(self) -> None:
        """Router, proxy, replica engines (through their actors), actors,
        driver, worker nodes, head, temp dir; failures collected and raised
        at the end so one stuck part never leaves the others running."""
        problems: list[str] = []

        def attempt(what: str, fn: Callable[[], Any]) -> None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                problems.append(f"{what}: {type(e).__name__}: {e}")

        if self.router is not None:
            attempt("router", self.router.stop)
        if self.proxy is not None:
            attempt("fault-proxy", self.proxy.stop)
        for r in reversed(self.replicas()):
            attempt(r.name, r.stop)
        if self._connected:
            ray = sys.modules["ray"]
            for a in self._actors:
                attempt("actor", lambda a=a: ray.kill(a, no_restart=True))
            attempt("ray driver", ray.shutdown)
            self._connected = False
        for n in reversed(self.ray_nodes):
            attempt(n.name, n.stop)
        if self.head is not None:
            attempt(self.head.name, self.head.stop)
        for r in self.replicas():  # an engine that outlived its node (paused, lost)
            if r.pid and group_members(r.pid):
                attempt(r.name, lambda r=r: os.killpg(r.pid, signals.SIGKILL))
        if self.temp_dir is not None and any(n.cgroup for n in self.ray_nodes):
            # Whatever is still in the nodes' cgroups was born there after
            # everything above stopped: an EngineCore whose API server Ray
            # ended with its actor's worker, reparented to init, in no
            # process group of ours. Found by the cgroup, ended by pid.
            left = cgroup2.kill_all(f"/{self.temp_dir.name}")
            if left:
                self.progress(f"ended {len(left)} process(es) left in the Ray nodes' cgroups: "
                              f"{left[:10]}")
            problems += cgroup2.remove(f"/{self.temp_dir.name}")
        if self.temp_dir is not None:
            self._save_ray_logs()
            attempt("ray temp dir", lambda: shutil.rmtree(self.temp_dir, ignore_errors=False))
        if problems:
            raise RuntimeError("teardown left problems: " + "; ".join(problems))

    def gcs_log_tail(self, lines: int = 15) -> str:
        """The GCS's last log lines, for an error about a node that did not
        join (the GCS is the side that decides); empty when there is none."""
        logs = sorted((self.temp_dir or Path("/nonexistent")).glob("session_*/logs/gcs_server.*"))
        tail: list[str] = []
        for f in logs:
            try:
                text = f.read_bytes()[-20_000:].decode("utf-8", "replace")
            except OSError:
                continue
            tail += [f"--- {f.name}"] + text.splitlines()[-lines:]
        return ("\nLast lines of the GCS's log:\n" + "\n".join(tail)) if tail else ""

    def _save_ray_logs(self) -> None:
        """Ray's own logs (raylet, gcs, workers) go with the temp dir: copy
        the small ones into the run's log directory first (best effort)."""
        try:
            dest = self.log_dir / "ray-logs"
            for f in (self.temp_dir or Path("/nonexistent")).glob("session_*/logs/*"):
                if f.is_file() and f.stat().st_size < 2_000_000 and \
                        f.suffix in (".out", ".err", ".log"):
                    dest.mkdir(exist_ok=True)
                    shutil.copy2(f, dest / f.name)
        except OSError:
            pass


def _free_range(n: int) -> list[int]:
    """``n`` consecutive ports free now (Ray wants a worker port range)."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RayError(f"no {n} consecutive free ports for Ray workers in 20000-32000")
