"""``--cluster docker``: the same topology as the local backend (a router in
front of N vLLM replicas, the fault proxy on every link), each node a
container on a private Docker network of the cluster.

How traffic flows (every address is the run's own network or loopback):

    harness -> proxy (host, on the network's gateway) -> router container
    router container -> proxy (gateway) -> replica container

The fault proxy stays a process on the host, listening on the network's
gateway address, so link faults work exactly as on the local backend. The
harness reaches every container at its address on the network (no port is
published). Kernel faults reach a container's network namespace from the
host with ``nsenter``; signals go to the container's processes by their
host pids. So containers run with every capability dropped and
``no-new-privileges``: nothing in them can change the network or the host.

Everything created carries the labels of ``ordeal.containers``; teardown
removes the cluster's containers and network, and a crashed harness's are removed
by label (``python -m faults heal-all``, and at every suite start).

Where a replica's engine comes from (``--docker-engine``): "mounted" (the
default) runs this machine's Python and vLLM, bind-mounted read-only into
the suite's base image; "image" runs the ``--docker-image``'s own
entrypoint with the server's arguments after the image (the vLLM
OpenAI-server image's convention) and mounts only the model (read-only) and
the log directory, where Ordeal puts the node header the replica loads.
The router stays Ordeal's (base image, this machine's vllm-router).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal as signals
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from clusters.base import ClusterBase
from clusters.docker_image import ensure_base_image
from engines.vllm.adapter import prepare_model
from engines.vllm.cpus import replica_cpus
from engines.vllm.model import TinyModel
from engines.vllm.node_header import FILES as NODE_HEADER_FILES
from engines.vllm.nodes import (
    REPLICA_HINT,
    REPO_ROOT,
    ROUTER_HINT,
    SERVED_MODEL_NAME,
    ReplicaConfig,
    probe_vllm_fingerprint,
    replica_argv,
    replica_env,
    router_argv,
    router_fingerprint,
    server_args,
)
from engines.vllm.startup import failure_reason
from nodes.ports import free_ports
from nodes.waits import wait_http_ok
from ordeal.config import ClusterSpec
from ordeal.containers import (
    CLUSTER_LABEL,
    IMAGE_LABEL,
    NODE_LABEL,
    OWNER_LABEL,
    DockerUnavailable,
    container_members,
    docker_client,
)
from ordeal.faketime import DEBIAN_LIBFAKETIME, faketime_env, prepare_clock_file
from ordeal.networks import SESSION_NETWORKS, Allowance
from ordeal.ownership import CLUSTER_ENV, NODE_ENV, OWNER_PID_ENV, Owner
from ordeal.topology import Endpoint, Link, NodeNotReady, Role

Progress = Callable[[str], None]
#: Ports inside every container: each has an address of its own, so all
#: replicas listen on the same port.
ENGINE_PORT = 8000
ROUTER_METRICS_PORT = 29000
#: How long ``docker kill`` may take to answer before the kill is left to be
#: confirmed from the container's state: Docker itself waits 10 s for the
#: exit event, and on a busy machine the exit can come later than that.
KILL_ANSWER_S = 10.0


class DockerError(RuntimeError):
    """A container could not be created or started; says why and what to do."""


class DockerNode:
    """A Node (ordeal.topology) backed by one container."""

    def __init__(self, name: str, role: Role, client: Any, container_id: str,
                 endpoint: Endpoint, hint: str, clock_file: Path | None = None):
        self.name = name
        self.role = role
        self.client = client
        self.container_id = container_id
        self.endpoint = endpoint
        self.hint = hint
        self._clock_file = clock_file
        self._fingerprint: str | None = None
        self.metrics_port: int | None = None
        self.served_model_name = SERVED_MODEL_NAME  # what the fingerprint probe asks for
        self.argv: list[str] = []  # the container's command, for summary.json
        self.cpus: tuple[int, ...] | None = None  # its cpuset; None: every core
        self.journal_dir: Path | None = None  # where the node writes its request journal

    def _state(self) -> dict[str, Any]:
        try:
            return self.client.api.inspect_container(self.container_id)["State"]
        except Exception:  # noqa: BLE001 - removed, or the engine forgot it
            return {"Running": False, "Status": "removed", "ExitCode": None, "Pid": 0}

    def is_running(self) -> bool:
        return bool(self._state().get("Running"))

    @property
    def starts(self) -> str | None:
        """When the container last started (the engine's ``StartedAt``): a
        restart changes it, so the engine's counters are compared only
        across one start (engines.vllm.adapter.node_starts)."""
        return self._state().get("StartedAt") or None

    def exit_code(self) -> int | None:
        state = self._state()
        return None if state.get("Running") else state.get("ExitCode")

    def status(self) -> str:
        state = self._state()
        return f"{state.get('Status')} (exit code {state.get('ExitCode')})"

    @property
    def pid(self) -> int | None:
        """Host pid of the container's init; None when it does not run."""
        state = self._state()
        return int(state["Pid"]) if state.get("Running") and state.get("Pid") else None

    def netns_pid(self) -> int | None:
        """A pid inside the container's network namespace, for nsenter."""
        return self.pid

    def pids(self) -> list[int]:
        return container_members(self.container_id) if self.is_running() else []

    def signal(self, signum: int) -> str | None:
        """SIGKILL through the engine (the container then counts as exited,
        as after an OOM kill); any other signal to each of its processes by
        host pid, so SIGSTOP stops the whole tree, not just its init."""
        if signum == signals.SIGKILL:
            return self._kill()
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return None

    def _kill(self) -> str | None:
        """``docker kill``, answered or not within ``KILL_ANSWER_S``. Never
        fails on the engine's own word: Docker gives up waiting for the exit
        event after 10 s ("did not receive an exit event") while the kill
        still takes effect, so the caller confirms it from the container's
        state. Returns what the engine said (an error, or no answer yet);
        None when it simply succeeded."""
        said: list[str] = []

        def call() -> None:
            try:
                self.client.api.kill(self.container_id, signal="SIGKILL")
            except Exception as e:  # noqa: BLE001 - the engine's word, for the record
                said.append(f"docker kill: {e}")
            else:
                said.append("")

        caller = threading.Thread(target=call, name=f"docker-kill-{self.name}", daemon=True)
        caller.start()
        caller.join(KILL_ANSWER_S)
        if not said:
            return (f"docker kill: no answer within {KILL_ANSWER_S:.0f} s (the kill is confirmed "
                    "from the container's state)")
        return said[0] or None

    @property
    def clock_file(self) -> Path | None:
        return self._clock_file

    def start(self) -> None:
        try:
            self.client.api.start(self.container_id)
        except Exception as e:  # noqa: BLE001 - the engine's message is the useful part
            raise DockerError(f"{self.name}: container {self.container_id[:12]} did not start: "
                              f"{e}\nlast log lines:\n" + "\n".join(self.log_tail(10))) from None

    def stop(self, grace: float = 10.0) -> None:
        try:
            self.client.api.stop(self.container_id, timeout=max(1, int(grace)))
        except Exception as e:  # noqa: BLE001
            if self.is_running():
                raise DockerError(f"{self.name}: docker stop failed: {e}") from None

    def remove(self) -> None:
        try:
            self.client.api.remove_container(self.container_id, force=True)
        except Exception as e:  # noqa: BLE001
            if "No such container" not in str(e):
                raise

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            raw = self.client.api.logs(self.container_id, tail=lines)
        except Exception as e:  # noqa: BLE001
            return [f"(no logs of container {self.container_id[:12]}: {e})"]
        return raw.decode("utf-8", "replace").splitlines()[-lines:]

    def save_log(self, path: Path) -> None:
        """The container's whole log, into the run's log directory (the
        container and its log go away at teardown)."""
        try:
            path.write_bytes(self.client.api.logs(self.container_id))
        except Exception:  # noqa: BLE001 - best effort: the tail was shown on failure
            pass

    def wait_ready(self, timeout: float) -> None:
        wait_http_ok(name=self.name, url=f"{self.endpoint.url}/health", timeout=timeout,
                     is_running=self.is_running, exit_code=self.exit_code,
                     log_tail=self.log_tail, reason=failure_reason,
                     hint=f"container {self.container_id[:12]} is {self.status()}; "
                          f"docker logs {self.container_id[:12]}. {self.hint}")
        self._fingerprint = (probe_vllm_fingerprint(self.endpoint.url,
                                                    model=self.served_model_name)
                             if self.role == "replica" else router_fingerprint())

    def fingerprint(self) -> str:
        return self._fingerprint or "unknown"


def image_has_file(client: Any, image: str, path: str) -> bool:
    """Whether ``image`` holds ``path`` (a throwaway container, no network)."""
    try:
        client.containers.run(image, entrypoint=["/bin/sh", "-c", f"test -e {path}"],
                              remove=True, network_mode="none", labels={IMAGE_LABEL: "probe"})
        return True
    except Exception:  # noqa: BLE001 - no shell, no file: either way, not there
        return False


class DockerCluster(ClusterBase):
    backend = "docker"
    engine = "vllm"

    def __init__(self, spec: ClusterSpec, cluster_id: str, log_dir: Path,
                 progress: Progress = print, model: TinyModel | None = None,
                 client: Any | None = None):
        super().__init__(spec, cluster_id, log_dir, progress, model)
        self.client = client
        self.network: Any = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway: str | None = None
        self.image: str | None = None
        self._allowed: Allowance | None = None

    def _describe_extra(self) -> dict[str, Any]:
        return {"image": self.image,
                "network": {"name": self.network.name if self.network else None,
                            "subnet": str(self.subnet) if self.subnet else None}}

    def _node_extra(self, node: Any) -> dict[str, Any]:
        return {"container": node.container_id[:12]}

    # -- lifecycle --------------------------------------------------------
    def _labels(self, node: str | None = None) -> dict[str, str]:
        labels = {CLUSTER_LABEL: self.cluster_id, OWNER_LABEL: Owner.current().label()}
        if node:
            labels[NODE_LABEL] = node
        return labels

    def _mounts(self, own_engine: bool = False) -> list[str]:
        """What a container needs from the host, read-only at the same
        paths: the interpreter (unless it is the system's, which the image
        has), the virtual environment, the repository and the model; and the
        run's log directory writable, for the clock files. A replica that
        runs its image's own engine (``own_engine``) gets the model and the
        log directory only."""
        paths = [] if own_engine else [Path(sys.prefix), REPO_ROOT]
        if not own_engine and not str(Path(sys.base_prefix).resolve()).startswith("/usr"):
            paths.append(Path(sys.base_prefix).resolve())
        if self.model is not None:
            paths.append(Path(self.model.path).resolve())
        binds = [f"{p}:{p}:ro" for p in dict.fromkeys(p.resolve() for p in paths)]
        binds.append(f"{self.log_dir.resolve()}:{self.log_dir.resolve()}:rw")
        return binds

    def _create(self, name: str, role: Role, ip: str, argv: list[str], env: dict[str, str],
                hint: str, clock_file: Path | None = None, image: str | None = None,
                own_engine: bool = False, cpus: tuple[int, ...] | None = None) -> DockerNode:
        api = self.client.api
        image = image or self.image
        host_config = api.create_host_config(
            binds=self._mounts(own_engine), shm_size="1g", init=True,
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=self.spec.docker_memory or None,
            nano_cpus=int(self.spec.docker_cpus * 1e9) if self.spec.docker_cpus else None,
            cpuset_cpus=",".join(map(str, cpus)) if cpus else None,  # engines.vllm.cpus
            device_requests=self._gpu_requests(),
        )
        networking = api.create_networking_config(
            {self.network.name: api.create_endpoint_config(ipv4_address=ip)})
        cname = f"ordeal-{self.cluster_id}-{name}"[:128]
        try:
            made = api.create_container(
                image, command=argv, name=cname, environment=env,
                labels=self._labels(name), host_config=host_config,
                networking_config=networking, user=f"{os.getuid()}:{os.getgid()}",
                working_dir="/tmp")
        except Exception as e:  # noqa: BLE001 - the engine's message is the useful part
            raise DockerError(f"{name}: cannot create a container from image {image}: "
                              f"{e}") from None
        node = DockerNode(name, role, self.client, made["Id"], Endpoint(ip, ENGINE_PORT), hint,
                          clock_file)
        node.journal_dir = self.log_dir.resolve()
        node.argv = list(argv)
        node.image = image
        node.binds = self._mounts(own_engine)
        node.cpus = cpus
        return node

    def _gpu_requests(self) -> list[Any] | None:
        if not self.spec.docker_gpus:
            return None
        import docker  # type: ignore[import-untyped]

        return [docker.types.DeviceRequest(count=self.spec.docker_gpus,
                                           capabilities=[["gpu"]])]

    def _env(self, name: str, base: dict[str, str]) -> dict[str, str]:
        keep = {k: v for k, v in base.items()
                if k.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "FAKETIME", "LD_PRELOAD",
                                 "PYTHONPATH", "DO_NOT_TRACK", "OMP_"))}
        return {**keep, "HOME": "/tmp", "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/bin:/bin",
                CLUSTER_ENV: self.cluster_id, NODE_ENV: name,
                # The request journal (no_duplicate_execution) goes beside
                # the node's log, on the writable mount of the log directory.
                "ORDEAL_LOG_DIR": str(self.log_dir.resolve()),
                OWNER_PID_ENV: str(os.getpid())}

    def _image_env(self, name: str, core: int, clock: Path | None, node_header: Path,
                   config: ReplicaConfig) -> dict[str, str]:
        """A replica's environment when it runs its image's own engine: the
        image's PATH and Python stay; Ordeal adds the labels, the node
        header's package (in the log directory), the offline flags, the
        image's libfaketime for clock faults, and the user's --engine-env."""
        env = replica_env({}, core, None, config)
        for key in ("PYTHONPATH", "LD_PRELOAD"):
            env.pop(key, None)
        env = {k: v for k, v in env.items() if k not in dict(config.engine_env)}
        env.update({"HOME": "/tmp", "PYTHONPATH": str(node_header),
                    CLUSTER_ENV: self.cluster_id, NODE_ENV: name,
                    "ORDEAL_LOG_DIR": str(self.log_dir.resolve()),
                    OWNER_PID_ENV: str(os.getpid())})
        if clock is not None:
            prepare_clock_file(clock)
            env.update(faketime_env(clock, library=DEBIAN_LIBFAKETIME))
        env.update(dict(config.engine_env))
        return env

    def _node_header_package(self) -> Path:
        """The node header (engines/vllm/node_header.py) and what it imports
        (its ``FILES``), copied into the log directory: an image's own Python
        loads them from there with --middleware, and nothing else of Ordeal
        enters the container."""
        root = self.log_dir.resolve() / "ordeal-node-header"
        for rel in NODE_HEADER_FILES:
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / rel, dest)
        for pkg in ("engines", "engines/vllm", "ordeal"):
            (root / pkg / "__init__.py").write_text("")
        return root

    def start(self) -> "DockerCluster":
        t0 = time.monotonic()
        if self.client is None:
            self.client = docker_client()
        if self.model is None:
            self.model = prepare_model(self.spec, self.progress)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        own_engine = self.spec.docker_engine == "image"
        base = None if self.spec.docker_image and not own_engine else \
            ensure_base_image(self.client, self.progress)
        self.image = self.spec.docker_image or base
        # The router is Ordeal's part: with the image's own engine it runs
        # on the base image with this machine's vllm-router, as before.
        self.router_image = base if own_engine else self.image
        if not self.client.images.list(name=self.image):
            raise DockerError(f"image {self.image!r} is not in this Docker engine (no registry "
                              "is used): load it (docker load -i FILE) or build it, or leave "
                              "--docker-image out to use the suite's own base image")
        faketime_in_image = own_engine and self.spec.clock_faults and \
            image_has_file(self.client, self.image, DEBIAN_LIBFAKETIME)
        if own_engine:
            node_header_path = self._node_header_package()
            self.progress(f"--docker-engine image: replicas run {self.image}'s own entrypoint "
                          f"and vLLM; mounted: the model (read-only) and {self.log_dir}; "
                          + ("clock faults through the image's libfaketime" if faketime_in_image
                             else f"no clock faults (the image has no {DEBIAN_LIBFAKETIME})"))
        self._create_network()
        subnet_hosts = self.subnet.hosts()
        next(subnet_hosts)  # the gateway
        ips = [str(next(subnet_hosts)) for _ in range(self.spec.replicas + 2)]
        cores = sorted(os.sched_getaffinity(0))
        replicas = []
        for i in range(self.spec.replicas):
            name = f"replica-{i}"
            cpus = replica_cpus(cores, self.spec.replicas, i, self.spec.replica_cpus)
            config = ReplicaConfig.of(self.spec)
            if own_engine:
                clock = (self.log_dir / f"{name}.faketime") if faketime_in_image else None
                env = self._image_env(name, cpus.compute, clock, node_header_path, config)
                argv = server_args(self.model.path, "0.0.0.0", ENGINE_PORT, config)
            else:
                clock = (self.log_dir / f"{name}.faketime") if self.spec.clock_faults else None
                env = {**self._env(name, replica_env({}, cpus.compute, clock, config)),
                       **dict(config.engine_env)}  # the user's, whatever their names
                argv = replica_argv(str(Path(sys.prefix) / "bin" / "python"), self.model.path,
                                    "0.0.0.0", ENGINE_PORT, config)
            node = self._create(name, "replica", ips[i], argv, env, REPLICA_HINT, clock,
                                own_engine=own_engine, cpus=cpus.allowed)
            node.served_model_name = config.served_model_name
            replicas.append(node)
        self.nodes.extend(replicas)
        for r in replicas:
            r.start()
        self.progress(f"starting {len(replicas)} vLLM replica container(s) on {self.network.name}"
                      f" ({self.subnet}) from image {self.image}")
        self._wait_all(replicas)
        worker_urls = self._start_proxy(replicas, ips[-1])
        router_argv_ = router_argv(str(Path(sys.prefix) / "bin" / "vllm-router"), "0.0.0.0",
                                   ENGINE_PORT, worker_urls, metrics_port=ROUTER_METRICS_PORT,
                                   profile=self.spec.router_profile,
                                   extra_args=self.spec.router_args)
        self.router = self._create("router", "router", ips[-1], router_argv_,
                                   self._env("router", {}), ROUTER_HINT,
                                   image=self.router_image)
        self.router.metrics_port = ROUTER_METRICS_PORT
        self.nodes.append(self.router)
        self.router.start()
        self.router.wait_ready(60)
        self.ready(t0, f"router at {self.router.endpoint.url} in front of "
                       f"{len(replicas)} replica(s)")
        return self

    def _create_network(self) -> None:
        """A bridge network of the cluster with a /24 of its own, so that every
        node gets a fixed address (kept across a kill and restart)."""
        import docker  # type: ignore[import-untyped]

        name = f"ordeal-{self.cluster_id}-{uuid.uuid4().hex[:6]}"
        last: Exception | None = None
        for subnet in free_subnets(self.client):
            gateway = str(next(subnet.hosts()))
            ipam = docker.types.IPAMConfig(pool_configs=[
                docker.types.IPAMPool(subnet=str(subnet), gateway=gateway)])
            try:
                self.network = self.client.networks.create(name, driver="bridge", ipam=ipam,
                                                           labels=self._labels())
            except Exception as e:  # noqa: BLE001 - taken meanwhile: try the next one
                last = e
                if "overlap" in str(e).lower():
                    continue
                break
            self.subnet, self.gateway = subnet, gateway
            # The cluster's own network: load and faults may go there while
            # it exists, nowhere else new.
            self._allowed = SESSION_NETWORKS.allow(subnet)
            return
        raise DockerError(f"cannot create the Docker network {name}: {last}; remove unused "
                          "networks (docker network prune) and try again")

    def _start_proxy(self, replicas: list[DockerNode], router_ip: str) -> list[str]:
        """The fault proxy on the host, on the network's gateway address; the
        router container reaches the replicas through it."""
        assert self.gateway is not None
        gw = self.gateway
        n = len(replicas)
        ports = free_ports(n + 2, gw)
        control = Endpoint(gw, ports[-1])
        router_ep = Endpoint(router_ip, ENGINE_PORT)
        self.links = [Link(f"router-{r.name}", "router", r.name, Endpoint(gw, p), r.endpoint,
                           control) for r, p in zip(replicas, ports[:n])]
        self.links.append(Link("client-router", "client", "router", Endpoint(gw, ports[n]),
                               router_ep, control))
        self._start_fault_proxy(control, ("--listen-host", gw,
                                          "--allow-upstream", str(self.subnet)))
        return [x.listen.url for x in self.links[:-1]]

    def _wait_all(self, nodes: list[DockerNode]) -> None:
        errors: list[str] = []
        for node in nodes:  # the waits share one deadline: they run side by side anyway
            try:
                node.wait_ready(self.spec.ready_timeout_s)
                self.progress(f"{node.name} ready ({node.fingerprint()})")
            except NodeNotReady as e:
                errors.append(str(e))
        if errors:
            raise NodeNotReady("\n\n".join(errors))

    def stop(self) -> None:
        """Remove every container and the network of the cluster (their logs are
        saved into the log directory first); collect failures and raise them
        at the end, so one stuck container never leaves the others."""
        problems = []
        for node in reversed(self.nodes):
            try:
                node.save_log(self.log_dir / f"{node.name}.log")
                node.remove()
            except Exception as e:  # noqa: BLE001 - keep removing the rest
                problems.append(f"{node.name}: {e}")
        if self.proxy is not None:
            try:
                self.proxy.stop()
            except Exception as e:  # noqa: BLE001
                problems.append(f"fault-proxy: {e}")
        if self.network is not None:
            try:
                self.network.remove()
            except Exception as e:  # noqa: BLE001
                problems.append(f"network {self.network.name}: {e}")
        if self._allowed is not None:
            self._allowed.undo()
            self._allowed = None
        if problems:
            raise RuntimeError("teardown left problems: " + "; ".join(problems))


#: Where run networks are carved from: /24s that Docker's default pools
#: (172.17-31.0.0/16, 192.168.0.0/16) leave alone only in part, so each
#: candidate is checked against the engine's networks and this machine's
#: addresses first.
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")


def free_subnets(client: Any) -> Iterator[ipaddress.IPv4Network]:
    """/24s of SUBNET_POOL that no Docker network and no local interface uses."""
    used: list[Any] = []
    for net in client.networks.list():
        for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
            if cfg.get("Subnet"):
                used.append(ipaddress.ip_network(cfg["Subnet"], strict=False))
    routes = Path("/proc/net/route")
    if routes.exists():
        for line in routes.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 7:
                dest = ipaddress.IPv4Address(int(fields[1], 16).to_bytes(4, "little"))
                mask = ipaddress.IPv4Address(int(fields[7], 16).to_bytes(4, "little"))
                if int(mask):
                    used.append(ipaddress.ip_network(f"{dest}/{mask}", strict=False))
    for subnet in SUBNET_POOL.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            yield subnet


def unavailable_reason() -> str | None:
    """Why the docker backend cannot run here (for a skip that says so), or
    None when an engine answers."""
    try:
        docker_client()
    except DockerUnavailable as e:
        return str(e)
    return None
