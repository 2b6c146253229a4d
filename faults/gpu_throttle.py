"""gpu_throttle: take compute away from a replica.

On a CUDA machine a co-tenant runs bf16 matmuls on the replica's GPU: the GPU
is then time-shared and power-capped, which NVML shows (SM clock down,
clocks-event reason SwPowerCap), exactly what a noisy neighbour does. We
throttle by load only and never touch clocks, power limits, persistence or
compute mode: those outlive a crash and belong to the machine's owner.

On a CPU-only machine (or with ``backend="cpu"``) the analog is a CFS CPU
quota on the node's own processes (``faults.cgroup``): they are moved into a
cgroup of the suite's (``<cpu mount>/ordeal-<tag>``) that may use
``cpu_fraction`` of the CPUs the node runs on, and moved back on heal.
A competing CPU load was tried first and measured to do nothing here
(436.8 tok/s before, 435.7 during): the kernel's autogroup scheduling gives
each session an equal share, and the tiny model's bottleneck processes
float over both cores. It was removed rather than kept as a mode that
looks like a fault and is not one. The result's ``analog`` says which was
used (``cuda-matmul`` or ``cpu-quota``), with the quota.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Node

from . import cgroup
from .base import Effect, healed
from .cotenant import CotenantFault, helper_argv
from .ledger import Ledger, LedgerEntry
from .safety import require_running

CPU_QUOTA = "cpu-quota"


class GpuThrottle(CotenantFault):
    kind = "gpu_throttle"
    traits = KindTraits(
        kind, hookable=True, on_gpu=True,
        endurance=EnduranceChoice("one", {"cpu_fraction": 0.2}, position=7),
        chaos_mesh_none=(
            "Chaos Mesh has no GPU stressor and no CPU-quota action; StressChaos's CPU "
            "stressor only competes for the pod's CPUs, which Ordeal measured to change "
            "nothing in a replica's token rate (faults/gpu_throttle.py), so it is no "
            "equivalent"))
    needs_root = True
    privilege = (
        'on a CPU-only machine it creates a cgroup under /sys/fs/cgroup and moves the '
        "node's processes into it with a CPU quota (writing cgroup files); on a GPU "
        '(backend cuda) it is a co-tenant CUDA process and needs no root')
    without_root = (
        'process_pause on the replica for a stall, or gpu_throttle on a GPU machine (a '
        'CUDA co-tenant needs no root)')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, backend: str = "auto",
                 device: int = 0, matmul_size: int = 8192, cpu_fraction: float = 0.2,
                 period_us: int = 100_000):
        super().__init__(node, run_id, ledger, backend, device)
        self.matmul_size = matmul_size
        self.cpu_fraction = cpu_fraction
        self.period_us = period_us
        # Named by our own tag: the ledger id does not exist yet when the
        # plan (and so the name) goes into the ledger entry.
        self.cgroup_name = f"{cgroup.PREFIX}{self.tag[:12]}"
        self._quota: dict[str, Any] | None = None

    def root_reason(self) -> str | None:
        """Root only for the CPU quota: a CUDA co-tenant is an ordinary process."""
        return None if self._resolve_backend() == "cuda" else super().root_reason()

    @classmethod
    def root_reason_on(cls, gpu_backend: str) -> str | None:
        return None if gpu_backend == "cuda" else super().root_reason_on(gpu_backend)

    # --- CUDA: the co-tenant path of CotenantFault, unchanged --------------------

    def _plan_helper(self, backend: str) -> tuple[list[str], str, dict[str, Any]]:
        argv = helper_argv("cuda-matmul", "--device", str(self.device),
                           "--size", str(self.matmul_size))
        return argv, "cuda-matmul", {"device": self.device, "matmul_size": self.matmul_size}

    # --- CPU: a cgroup quota, or the co-tenant for CUDA --------------------------

    def _preflight(self) -> None:
        self._quota = None
        if self._resolve_backend() == "cuda":
            super()._preflight()
            return
        require_running(self.node, self.kind)
        self._quota = cgroup.plan_quota(self.cgroup_name, self.node.pids(), self.cpu_fraction,
                                        self.period_us, kind=self.kind)

    def _inverse(self) -> dict[str, Any]:
        if self._quota is None:
            return super()._inverse()
        return {"analog": CPU_QUOTA, "cgroup": self._quota}

    def _act(self) -> dict[str, Any]:
        if self._quota is None:
            return super()._act()
        q = self._quota
        moved = cgroup.apply(q)
        return {"analog": CPU_QUOTA, "cgroup": q["dir"], "cpu_fraction": q["fraction"],
                "quota_us": q["quota_us"], "period_us": q["period_us"], "ncpus": q["ncpus"],
                "moved_pids": moved}

    def observe(self) -> Effect:
        """On a CPU machine: the quota bit (the cgroup's cpu.stat counts
        throttled periods) and the node's processes are in it."""
        if self._quota is None:
            return super().observe()
        directory = Path(self._quota["dir"])
        stat = cgroup.cpu_stat(directory)
        throttled = stat.get("nr_throttled", 0)
        return Effect(throttled > 0 and bool(cgroup.procs_in(directory)),
                      "the cgroup's throttled periods (cpu.stat) and its processes",
                      {"nr_throttled": throttled, "nr_periods": stat.get("nr_periods"),
                       "processes": len(cgroup.procs_in(directory)), "cgroup": str(directory)})

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        if entry.inverse.get("analog") != CPU_QUOTA:
            return super().undo(entry)
        return cgroup.restore(entry.inverse["cgroup"])

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        if entry.inverse.get("analog") != CPU_QUOTA:
            return super().heal_line(entry, done)
        what = (f"moved pid(s) {done['moved_back']} back and removed {done['cgroup']}"
                if done["removed"] else f"{done['cgroup']} was already gone")
        return f"{healed(entry)}: {what}"
