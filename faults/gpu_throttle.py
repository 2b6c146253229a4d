"""gpu_throttle: take compute away from a replica with a co-tenant's load.

On a CUDA machine a co-tenant runs bf16 matmuls on the replica's GPU: the GPU
is then time-shared and power-capped, which NVML shows (SM clock down,
clocks-event reason SwPowerCap), exactly what a noisy neighbour does. We
throttle by load only and never touch clocks, power limits, persistence or
compute mode: those outlive a crash and belong to the machine's owner.

On a CPU-only machine the analog is competing CPU load on the cores the
replica may run on (``cotenant.node_cpus``, the union of its processes'
affinities): ``per_cpu`` busy loops pinned to each, so the replica's threads
get about 1/(per_cpu+1) of each core. A competing
load was chosen over a cgroup CPU quota because it is the same mechanism as
on a GPU (a co-tenant, healed by ending one labelled process) and moves none
of the replica's processes between cgroups. The result's ``analog`` says
which was used.
"""

from __future__ import annotations

from typing import Any

from ordeal.topology import Node

from .base import FaultError
from .cotenant import CotenantFault, helper_argv, node_cpus
from .ledger import Ledger


class GpuThrottle(CotenantFault):
    kind = "gpu_throttle"

    def __init__(self, node: Node, run_id: str, ledger: Ledger, backend: str = "auto",
                 device: int = 0, matmul_size: int = 8192, per_cpu: int = 2,
                 cpus: list[int] | None = None):
        super().__init__(node, run_id, ledger, backend, device)
        self.matmul_size = matmul_size
        self.per_cpu = per_cpu
        self.cpus = cpus

    def _plan_helper(self, backend: str) -> tuple[list[str], str, dict[str, Any]]:
        if backend == "cuda":
            argv = helper_argv("cuda-matmul", "--device", str(self.device),
                               "--size", str(self.matmul_size))
            return argv, "cuda-matmul", {"device": self.device, "matmul_size": self.matmul_size}
        if self.per_cpu < 1:
            raise FaultError(f"gpu_throttle: per_cpu={self.per_cpu} would add no load; use 1 or more")
        cpus = self.cpus or node_cpus(self.node.pids())
        if not cpus:
            raise FaultError(f"gpu_throttle: found no CPU for {self.node.name} (no readable pid); "
                             "is it running? pass cpus=[...] to name them")
        argv = helper_argv("cpu", "--cpus", ",".join(map(str, cpus)),
                           "--per-cpu", str(self.per_cpu))
        return argv, "cpu-load", {"cpus": cpus, "per_cpu": self.per_cpu}
