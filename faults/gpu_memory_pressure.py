"""gpu_memory_pressure: take memory away from a replica with a co-tenant.

On a CUDA machine a co-tenant allocates (and touches) a fraction of the
replica's GPU memory, which NVML shows as memory used; the replica then
meets a full device when it grows its KV cache or restarts. On a CPU-only
machine the analog is a host memory hog of ``mb`` MB, every page touched:
MemAvailable drops by that much and the hog's RSS shows it. A hog was chosen
over a cgroup memory limit on the replica because a limit below its working
set makes the kernel OOM-kill the replica (a process_kill, not pressure), and
a hog heals by ending one labelled process. The result's ``analog`` says
which was used.
"""

from __future__ import annotations

from typing import Any

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Node

from .base import FaultError
from .cotenant import CotenantFault, helper_argv, mem_available_bytes
from .ledger import Ledger

#: Memory the machine keeps for everything else while a hog holds its share.
HOST_RESERVE_BYTES = 2 * 2**30


class GpuMemoryPressure(CotenantFault):
    kind = "gpu_memory_pressure"
    traits = KindTraits(kind, hookable=True, on_gpu=True,
                        endurance=EnduranceChoice("one", {"mb": 1024}, position=9))
    needs_root = False
    privilege = (
        "starts a co-tenant process as the harness's user that holds memory (device "
        'memory through CUDA on a GPU, host RAM on a CPU machine)')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, backend: str = "auto",
                 device: int = 0, fraction: float = 0.8, mb: int = 1024):
        super().__init__(node, run_id, ledger, backend, device)
        self.fraction = fraction
        self.mb = mb

    def _plan_helper(self, backend: str) -> tuple[list[str], str, dict[str, Any]]:
        if backend == "cuda":
            if not 0 < self.fraction < 1:
                raise FaultError(f"gpu_memory_pressure: fraction={self.fraction} must be "
                                 "between 0 and 1 (a share of the device's memory)")
            argv = helper_argv("cuda-memory", "--device", str(self.device),
                               "--fraction", str(self.fraction))
            return argv, "cuda-memory", {"device": self.device, "fraction": self.fraction}
        available = mem_available_bytes()
        if self.mb <= 0 or self.mb * 2**20 > available - HOST_RESERVE_BYTES:
            raise FaultError(
                f"gpu_memory_pressure: a {self.mb} MB hog does not fit: MemAvailable is "
                f"{available >> 20} MB and {HOST_RESERVE_BYTES >> 20} MB stay reserved for the "
                "machine; ask for fewer MB")
        argv = helper_argv("memory", "--mb", str(self.mb))
        return argv, "memory-hog", {"mb": self.mb, "mem_available_before": available}

    # -- the heal gives the memory back: measured, not assumed ---------------------
    def _aftermath(self) -> dict[str, Any]:
        """Just before the hog ends: the machine's MemAvailable, so that
        ``_recover`` can say how much came back."""
        self._available_before_heal = mem_available_bytes()
        return {}

    def _recover(self) -> dict[str, Any]:
        """For the host memory hog: how much MemAvailable grew across the
        heal (``memory_back_mb``), against the ``mb`` it held. Other
        processes move it too, so a suite compares it with a margin."""
        if self._plan is None or self._plan[1] != "memory-hog":
            return {}
        before = getattr(self, "_available_before_heal", None)
        if before is None:
            return {}
        return {"memory_back_mb": (mem_available_bytes() - before) >> 20,
                "memory_held_mb": self.mb}
