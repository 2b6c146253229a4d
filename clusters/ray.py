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
import shutil
import signal as signals
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from clusters.base import HostFrontCluster
from clusters.ray_actors import RayLoadLauncher, ReplicaActor
from clusters.ray_nodes import RayNode, RayPorts, RayReplica
from clusters.ray_runtime import (
    BACKEND_LABEL,
    TEMP_ROOT,
    RayError,
    check_loopback,
    free_range,
    ray_module,
)
from engines.registry import engine_for
from engines.vllm.adapter import prepare_model
from engines.vllm.model import TinyModel
from engines.vllm.nodes import (
    REPO_ROOT,
    ReplicaConfig,
    replica_argv,
)
from faults.ray_node import RAY_OWNER_FILE, RAY_TEMP_PREFIX
from nodes.ports import free_ports
from nodes.process import group_members
from ordeal import cgroup2
from ordeal.config import ClusterSpec, state_dir
from ordeal.ownership import Owner
from ordeal.topology import Endpoint, NodeNotReady

Progress = Callable[[str], None]


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
        worker_ports = free_range(24)
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
