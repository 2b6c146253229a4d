"""Parallel workers (pytest-xdist): what each may use, planned up front.

Pure arithmetic, so that a run that cannot fit fails at start with the
figures, not an hour in when the third cluster runs out of memory:
``plan_workers`` says which GPUs each worker gets and checks memory and
GPUs against what the machine has.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ConfigError

#: Memory of one CPU vLLM replica with the tiny model (measured: about 3 GB
#: over its three processes), and of a router, proxy and harness together.
REPLICA_GB = 3.0
OVERHEAD_GB = 1.0


@dataclass(frozen=True)
class WorkerPlan:
    worker: str            # "gw0", ... or "main" without xdist
    index: int
    workers: int
    gpus: tuple[int, ...]  # physical GPU indices this worker may use (CUDA_VISIBLE_DEVICES)
    cpus: tuple[int, ...] = ()  # CPU cores of this worker's harness and nodes (() = all)

    @property
    def cuda_visible_devices(self) -> str | None:
        return ",".join(map(str, self.gpus)) if self.gpus else None


def worker_index(worker: str) -> int:
    """``gw3`` -> 3; ``main`` (no xdist) -> 0."""
    if worker in ("main", "master", ""):
        return 0
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        raise ConfigError(f"xdist worker id {worker!r}: expected gw<N>")
    return int(worker[2:])


def plan_workers(worker: str, workers: int, replicas: int, mem_available_gb: float,
                 gpus_on_machine: int, gpus_per_worker: int,
                 replica_gb: float = REPLICA_GB, cpus: tuple[int, ...] = ()) -> WorkerPlan:
    """This worker's share, or ConfigError with the arithmetic when the
    machine cannot hold ``workers`` clusters of ``replicas`` replicas.

    ``cpus``: the cores this process may use. With several workers and at
    least as many cores, each worker gets cores of its own (every i-th), so
    one cluster's restart (a CPU-heavy model load) cannot slow another's
    requests: seen on 2 cores, a restart in one worker broke the other's
    recovery SLO until each had a core."""
    if workers < 1:
        raise ConfigError(f"{workers} workers: need at least one")
    if gpus_per_worker < 0:
        raise ConfigError(f"--gpus-per-worker {gpus_per_worker}: give 0 or more")
    need = workers * (replicas * replica_gb + OVERHEAD_GB)
    if need > mem_available_gb:
        raise ConfigError(
            f"not enough memory for {workers} worker(s): each runs its own cluster of "
            f"{replicas} replica(s) x {replica_gb:g} GB + {OVERHEAD_GB:g} GB (router, proxy, "
            f"harness) = {replicas * replica_gb + OVERHEAD_GB:g} GB, so {need:g} GB in all, "
            f"and {mem_available_gb:.1f} GB is available. Use fewer workers (-n), fewer "
            "--replicas, or a bigger machine")
    need_gpus = workers * gpus_per_worker
    if need_gpus > gpus_on_machine:
        raise ConfigError(
            f"not enough GPUs for {workers} worker(s) x --gpus-per-worker {gpus_per_worker} "
            f"= {need_gpus} GPU(s); this machine has {gpus_on_machine}. Use fewer workers "
            "(-n) or fewer GPUs per worker")
    i = worker_index(worker)
    if i >= workers:
        raise ConfigError(f"worker {worker} is outside {workers} worker(s)")
    gpus = tuple(range(i * gpus_per_worker, (i + 1) * gpus_per_worker))
    own = tuple(sorted(cpus)[i::workers]) if workers > 1 and len(cpus) >= workers else ()
    return WorkerPlan(worker, i, workers, gpus, own)


def visible_gpus(cuda_visible_devices: str | None, count: int) -> list[int]:
    """The physical (NVML) indices a CUDA process started here may use:
    CUDA_VISIBLE_DEVICES as CUDA reads it (numbers, in order, up to the
    first invalid entry), or every GPU when it is unset. CUDA's device i is
    element i of this list; NVML ignores the variable, so telemetry and
    fault checks translate through it."""
    if cuda_visible_devices is None:
        return list(range(count))
    out: list[int] = []
    for part in cuda_visible_devices.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= count or int(part) in out:
            break  # CUDA stops at the first entry it cannot use
        out.append(int(part))
    return out
