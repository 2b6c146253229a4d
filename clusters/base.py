"""What every backend's cluster does the same way: find its nodes and links,
say where clients connect, and stop in ``finally`` when used as a context
manager. Backends (``LocalCluster``, ``DockerCluster``, ``RayCluster``)
inherit it and only bring their nodes up and down; the two whose router and
fault proxy are processes on this machine (local, ray) share
``HostFrontCluster``'s start of those."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from engines.base import Upstream
from engines.registry import engine_for
from nodes.ports import free_ports
from nodes.process import REPO_ROOT, ManagedProcess
from nodes.waits import machine_cause, wait_http_ok
from ordeal.config import redact_argv
from ordeal.ownership import hold_cluster
from ordeal.topology import Endpoint, Link, NodeNotReady


def node_command(node: Any) -> list[str] | None:
    """The exact command a node runs (secret-looking flag values hidden), as
    summary.json and the report show it."""
    argv = getattr(node, "argv", None) or getattr(getattr(node, "process", None), "argv", None)
    return redact_argv(argv) if argv else None


def node_cpus(node: Any) -> list[int] | str:
    """The cores a node's processes may run on, as Ordeal set them (a local
    process's affinity, a container's cpuset): "all" when it set none."""
    cpus = getattr(node, "cpus", None) or getattr(getattr(node, "process", None), "cpus", None)
    return sorted(cpus) if cpus else "all"


#: A file each cluster start of this machine appends one line to (tab-
#: separated: backend, engine, replicas, seconds, the pytest test that started
#: it, pid), when the variable names one. ``.ci/run`` sets it; ``.ci/budget.py``
#: counts the starts per CI run and per test (issue 46).
STARTS_ENV = "ORDEAL_CLUSTER_STARTS"


def note_start(backend: str, engine: str, replicas: int, seconds: float) -> None:
    """Append this start to ``$ORDEAL_CLUSTER_STARTS`` (one ``write`` of one
    line in append mode, so starts from several processes do not mix)."""
    path = os.environ.get(STARTS_ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or "-"
    line = f"{backend}\t{engine}\t{replicas}\t{seconds:.1f}\t{test}\t{os.getpid()}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a count, never a reason for a start to fail


class ClusterBase:
    backend: str
    engine: str

    def __init__(self, spec: Any, cluster_id: str, log_dir: Path,
                 progress: Callable[[str], None] = print, model: Any = None):
        self.spec = spec
        self.cluster_id = cluster_id  # labels every process and container it starts
        hold_cluster(cluster_id, self)  # never a leftover to this process's reapers
        self.log_dir = Path(log_dir)
        self.progress = progress
        self.model = model  # a model already made (tests share one), else made at start
        self.nodes: list[Any] = []
        self.router: Any = None
        self.links: list[Link] = []
        self.proxy: ManagedProcess | None = None
        # Starts retried because the machine, not the system under test,
        # failed them (MACHINE_CAUSES), each with why: summary.json's
        # cluster.start_retries.
        self.start_retries: list[dict[str, Any]] = []

    def ready(self, t0: float, message: str) -> None:
        """Say the cluster is up (``<backend> cluster ready in Ns: ...``, the
        line users and ``.ci/budget.py`` read) and count the start."""
        seconds = time.monotonic() - t0
        prefix = "" if self.backend == "local" else f"{self.backend} "
        self.progress(f"{prefix}cluster ready in {seconds:.0f}s: {message}")
        note_start(self.backend, getattr(self, "engine", "?"),
                   sum(1 for n in self.nodes if getattr(n, "role", None) == "replica"), seconds)

    @property
    def entrypoint(self) -> Endpoint:
        """Where clients send traffic: the client-router link when the fault
        proxy is on (so faults can act on it), else the router itself."""
        if self.router is None:
            raise RuntimeError("cluster not started")
        for link in self.links:
            if link.dst == self.router.name:
                return link.listen
        return self.router.endpoint

    def link(self, name: str) -> Link:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(f"no link {name!r}; links: {[x.name for x in self.links]}"
                       + ("" if self.links else " (the fault proxy is off: spec.fault_proxy)"))

    def node(self, name: str) -> Any:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}; nodes: {[n.name for n in self.nodes]}")

    def replicas(self) -> list[Any]:
        return [n for n in self.nodes if n.role == "replica"]

    def describe(self) -> dict[str, Any]:
        """The cluster as summary.json's ``cluster`` records it."""
        model = getattr(self, "model", None)
        if model is not None and hasattr(model, "describe"):
            model_record: Any = model.describe()
        elif model is not None:
            model_record = {"name": model.name, "path": str(model.path), "sha256": model.sha256}
        else:
            model_record = None
        return {
            "backend": self.backend,
            "engine": self.engine,
            **self._describe_extra(),
            "model": model_record,
            # What the engine found at start (the vLLM build, GPU placement)
            # over its settings from the spec.
            "stack": {**engine_for(self.engine, self.spec).settings(self.spec),
                      **getattr(self, "stack_extra", {})},
            "start_retries": list(getattr(self, "start_retries", [])),
            "entrypoint": self.entrypoint.url if self.router else None,
            "links": [{"name": x.name, "listen": x.listen.url, "upstream": x.upstream.url}
                      for x in self.links],
            "nodes": [{"name": n.name, "role": n.role, "url": n.endpoint.url,
                       **self._node_extra(n), "fingerprint": n.fingerprint(),
                       # The cores its processes may run on (--replica-cpus); "all": any.
                       "cpus": node_cpus(n),
                       "command": node_command(n)}
                      for n in self.nodes],
        }

    def _start_fault_proxy(self, control: Endpoint, extra: tuple[str, ...] = ()) -> None:
        """One fault-proxy process for every link of the cluster (like a
        Toxiproxy server), labelled and ended by id like every node;
        ``extra`` argv for a backend's own needs (Docker: the listen host
        and the one network upstreams may be in)."""
        argv = [sys.executable, "-m", "faults.proxy", "--control",
                f"{control.host}:{control.port}", *extra, "--seed", str(self.spec.model_seed)]
        for x in self.links:
            argv += ["--link", f"{x.name}={x.listen.port}:{x.upstream.host}:{x.upstream.port}"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        self.proxy = ManagedProcess("fault-proxy", argv, env, self.log_dir / "fault-proxy.log",
                                    self.cluster_id)
        self.proxy.start()
        wait_http_ok(name="fault-proxy", url=f"{control.url}/health", timeout=30,
                     is_running=self.proxy.is_running, exit_code=self.proxy.exit_code,
                     log_tail=self.proxy.log_tail,
                     hint="run the proxy by hand with the argv in its log to see why")
        self.progress(f"fault proxy on {len(self.links)} links, control at {control.url}")

    def _describe_extra(self) -> dict[str, Any]:
        """What a backend adds to ``describe()`` (Docker: image, network)."""
        return {}

    def _node_extra(self, node: Any) -> dict[str, Any]:
        """What a backend adds to each node's entry (Docker: its container)."""
        return {}

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HostFrontCluster(ClusterBase):
    """A cluster whose fault proxy and router run as processes on this
    machine, in front of replicas wherever they run (local processes, Ray
    actors' engines). Needs ``spec``, ``progress``, ``log_dir``, ``cluster_id``,
    ``proxy`` and ``engine_adapter`` (engines/base.py)."""

    engine_adapter: Any

    def _start_front(self, replicas: list[Any]) -> Any:
        """The fault proxy, then the engine's router through it; returns
        the router, started and ready. Their ports are chosen only now,
        just before they bind: chosen at the start, one was taken during
        the replicas' 25 s start (vLLM's engine binds ephemeral ports) and
        the proxy failed with "address already in use"."""
        router_ep, upstreams = self._start_proxy_with_retries(replicas)
        router = self.engine_adapter.router(self, router_ep, upstreams)
        self.nodes.append(router)
        self.router = router
        router.start()
        router.wait_ready(60)
        return router

    def _start_proxy_with_retries(self, replicas: list[Any], attempts: int = 3
                                  ) -> tuple[Endpoint, list[tuple[str, Upstream, Endpoint]]]:
        """Start the fault proxy with a link per replica upstream (and the
        client-router link); returns the router's address and, per upstream,
        the address the router must use (the link's listener). A bind race
        is retried with new ports."""
        host = self.spec.host
        ups = [(r.name, u) for r in replicas for u in self.engine_adapter.upstreams(r)]
        n = len(ups)
        for attempt in range(1, attempts + 1):
            ports = free_ports(n + 3 if self.spec.fault_proxy else 1, host)
            router_ep = Endpoint(host, ports[0])
            if not self.spec.fault_proxy:
                return router_ep, [(name, u, u.endpoint) for name, u in ups]
            control = Endpoint(host, ports[-1])
            self.links = [Link(f"router-{name}{u.suffix}", "router", name, Endpoint(host, p),
                               u.endpoint, control) for (name, u), p in zip(ups, ports[1:n + 1])]
            self.links.append(Link("client-router", "client", "router",
                                   Endpoint(host, ports[n + 1]), router_ep, control))
            try:
                self._start_fault_proxy(control)
                return router_ep, [(name, u, x.listen)
                                   for (name, u), x in zip(ups, self.links[:-1])]
            except NodeNotReady as e:
                if self.proxy is not None:
                    self.proxy.stop()
                why = machine_cause(str(e))
                if why is None or attempt == attempts:
                    raise
                self.start_retries.append({"node": "fault-proxy", "attempt": attempt,
                                           "why": why})
                self.progress(f"fault proxy: a port was taken before it could bind; "
                              f"retrying with new ports ({attempt}/{attempts})")
        raise AssertionError("unreachable")

    def _ready_note(self, node: Any) -> str:
        """What the progress line says of a node that became ready."""
        return f"{node.name} ready ({node.fingerprint()})"

    def _wait_all(self, nodes: list[Any],
                  again: Callable[[Any], Any] | None = None) -> None:
        """Wait for every node side by side; all failures raised together.
        ``again(node)`` (a backend that can start a node anew: returns the
        new node, started): a node whose start failed for the machine
        (``MACHINE_CAUSES``: a port taken between choosing and binding it)
        is started once more through it, and the retry recorded in
        ``start_retries``. A failure of the system under test is never
        retried, and no node is retried twice."""
        errors: dict[Any, NodeNotReady] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            futures = {pool.submit(n.wait_ready, self.spec.ready_timeout_s): n for n in nodes}
            for fut in concurrent.futures.as_completed(futures):
                node = futures[fut]
                try:
                    fut.result()
                    self.progress(self._ready_note(node))
                except NodeNotReady as e:
                    errors[node] = e
        retried = []
        for node, e in list(errors.items()):
            why = machine_cause(str(e)) if again is not None else None
            if why is None:
                continue
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            self.start_retries.append({"node": node.name, "attempt": 1, "why": why,
                                       "error": first[:300]})
            self.progress(f"{node.name}: its start failed for the machine ({why}); "
                          "starting it once more")
            del errors[node]
            retried.append(again(node))
        try:
            if retried:
                self._wait_all(retried)
        except NodeNotReady as e:
            errors[None] = e
        if errors:
            raise NodeNotReady("\n\n".join(str(e) for e in errors.values()))
