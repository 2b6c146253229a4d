"""The Ray actors of the backend: ``ReplicaActor`` owns one engine (a vLLM
process group on a simulated Ray node) and ``RayLoadLauncher`` starts the
load's worker processes as actors, so the load can come from more than
one host."""

from __future__ import annotations

import os
import signal as signals
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusters.ray_runtime import BACKEND_LABEL, ray_module
from engines.vllm.nodes import (
    ReplicaConfig,
    replica_argv,
    replica_env,
)
from load.workers import START_TIMEOUT_S, SocketWorkers, WorkerJob, connect_and_run
from nodes.process import ManagedProcess, group_members
from ordeal import procfs

if TYPE_CHECKING:  # a type only: clusters.ray imports this module
    from clusters.ray import RayCluster


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


class ActorHandle:
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
        handles: list[ActorHandle] = []
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
                handles.append(ActorHandle(ray, actor, name))
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
