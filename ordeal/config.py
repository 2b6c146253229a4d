"""Run configuration: plain, typed, validated up front with errors that say
what was wrong and what to do. Nothing here starts a process."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def state_dir() -> Path:
    """Where the fault ledger and process records live: $ORDEAL_STATE_DIR, or
    ~/.cache/ordeal/state. One place, read by every layer."""
    base = os.environ.get("ORDEAL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ordeal", "state"
    )
    return Path(base)


class ConfigError(ValueError):
    """A bad setting. The message names the setting, the value and a fix."""


def parse_duration(text: str | float | int, setting: str = "duration") -> float:
    """'90', '90s', '5m', '72h', '1.5h' -> seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise ConfigError(
                f"{setting}: cannot read {text!r} as a duration; "
                "write a number with an optional unit, e.g. 90, 90s, 5m, 72h"
            )
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{setting}: must be more than zero, got {text!r}")
    return seconds


BACKENDS = ("local", "docker", "ray")
#: Inference engines a cluster can run (engines/base.py has their adapters).
ENGINES = ("vllm", "triton")


@dataclass(frozen=True)
class ClusterSpec:
    backend: str = "local"
    engine: str = "vllm"
    replicas: int = 2
    model_seed: int = 0
    ready_timeout_s: float = 300.0
    host: str = "127.0.0.1"
    # Put Ordeal's fault proxy on every link (client-router, router-replica-i)
    # so link faults (latency, bandwidth, resets, HTTP/SSE faults) can act.
    fault_proxy: bool = True
    # Start replicas under libfaketime (wall clock only, ~0% overhead
    # measured) so clock_drift can move their clocks.
    clock_faults: bool = True
    # --cluster docker only: the image every node runs (None: the suite's
    # own base image, built here with debootstrap), and per-container limits
    # (memory as Docker writes it, e.g. "4g"; CPUs as a fraction; GPUs for
    # an engine with the NVIDIA container runtime).
    docker_image: str | None = None
    docker_memory: str | None = None
    docker_cpus: float | None = None
    docker_gpus: int = 0
    # --cluster ray only: join the Ray cluster at this GCS address (host:port,
    # loopback or a network named with --allow-target) instead of starting
    # one; else the number of simulated worker nodes started here (0: one
    # per replica, at least two).
    ray_address: str | None = None
    ray_nodes: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--cluster: unknown backend {self.backend!r}; available: {', '.join(BACKENDS)}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine: unknown engine {self.engine!r}; available: "
                              f"{', '.join(ENGINES)}")
        if self.engine != "vllm" and self.backend != "local":
            raise ConfigError(f"--engine {self.engine} runs on --cluster local only for now "
                              f"(this run: --cluster {self.backend}); use --engine vllm there")
        if not 1 <= self.replicas <= 64:
            raise ConfigError(
                f"--replicas: {self.replicas} is out of range; use 1..64 "
                "(each local vLLM replica needs about 3 GB of memory)"
            )
        if self.ready_timeout_s <= 0:
            raise ConfigError("--ready-timeout: must be more than zero seconds")
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(
                f"host {self.host!r}: the local backend binds loopback only, "
                "so that no traffic leaves the machine"
            )
        if self.docker_cpus is not None and self.docker_cpus <= 0:
            raise ConfigError(f"--docker-cpus {self.docker_cpus}: give a number of CPUs above "
                              "zero (e.g. 1.5), or leave it out for no limit")
        if self.docker_gpus < 0:
            raise ConfigError(f"--docker-gpus {self.docker_gpus}: give 0 or more")
        if self.backend != "ray" and (self.ray_address or self.ray_nodes):
            raise ConfigError("--ray-address/--ray-nodes apply to --cluster ray only "
                              f"(this run: {self.backend})")
        if self.ray_nodes < 0 or self.ray_nodes > 16:
            raise ConfigError(f"--ray-nodes {self.ray_nodes}: give 1..16 simulated nodes, "
                              "or 0 for one per replica (at least two)")
        if self.ray_address is not None and (":" not in self.ray_address
                                             or not self.ray_address.rsplit(":", 1)[1].isdigit()):
            raise ConfigError(f"--ray-address {self.ray_address!r}: give the head's GCS address "
                              "as HOST:PORT, e.g. 127.0.0.1:6379")
        if self.backend != "docker" and (self.docker_image or self.docker_memory
                                         or self.docker_cpus or self.docker_gpus):
            raise ConfigError("--docker-image/--docker-memory/--docker-cpus/--docker-gpus "
                              f"apply to --cluster docker only (this run: {self.backend})")
