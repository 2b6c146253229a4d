"""The registry of fault kinds: every kind's class, by name. heal-all, the
schedule factory and ``python -m faults list|catalogue`` look kinds up
here. A new kind adds its class here (one module per kind); nothing in
faults/ but this module, the factory, heal-all and the CLI imports it, so the
kinds' modules never depend on one another through it."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from .bandwidth_limit import BandwidthLimit
from .base import Fault
from .clock_drift import ClockDrift
from .connection_reset import ConnectionReset
from .gpu_memory_pressure import GpuMemoryPressure
from .gpu_throttle import GpuThrottle
from .http_fault import HttpFault
from .lsn_jump import LsnJump
from .network_latency import NetworkLatency
from .network_partition import NetworkPartition
from .packet_loss import PacketLoss
from .process_kill import ProcessKill
from .process_pause import ProcessPause
from .ray_node import RayNodeLoss, RayNodePartition, RayNodePause

#: The kinds every backend runs (the endurance catalogue), in this order.
#: lsn_jump's entries of its Triton variant (faults.sequence_jump) are healed
#: through LsnJump, which hands them on.
_COMMON: tuple[type[Fault], ...] = (
    NetworkPartition, NetworkLatency, PacketLoss, BandwidthLimit, ConnectionReset, ClockDrift,
    LsnJump, GpuThrottle, GpuMemoryPressure, ProcessKill, ProcessPause, HttpFault,
)
#: Kinds that only one backend has, kept out of KINDS: ``--cluster ray``'s
#: node faults.
_BACKEND: tuple[type[Fault], ...] = (RayNodeLoss, RayNodePause, RayNodePartition)

KINDS: tuple[str, ...] = tuple(cls.kind for cls in _COMMON)
BACKEND_KINDS: tuple[str, ...] = tuple(cls.kind for cls in _BACKEND)
REGISTRY: dict[str, type[Fault]] = {cls.kind: cls for cls in (*_COMMON, *_BACKEND)}

#: Linux capability bits (linux/capability.h) of the names kinds declare.
CAP_BITS: dict[str, int] = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's effective capability mask (``CapEff``); None where it
    cannot be read (then capabilities are not judged)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def tools_missing(which: Callable[[str], str | None] = shutil.which,
                  kinds: Iterable[str] = (*KINDS, *BACKEND_KINDS)) -> set[str]:
    """The programs the ``kinds`` run (``Fault.tools``) that are not on PATH."""
    return {t for kind in kinds for t in REGISTRY[kind].tools if which(t) is None}


def unrunnable_kinds(euid: int, gpu_backend: str = "cpu", cap_eff: int | None = None,
                     kinds: Iterable[str] = KINDS,
                     missing_tools: Iterable[str] = ()) -> dict[str, str]:
    """``{kind: why}`` for each of ``kinds`` this harness cannot inject, and
    exactly what is missing. Pure: the caller gives the effective uid, the
    effective capability mask (None: unknown, not judged) and the co-tenant
    backend ("cuda" where a GPU is seen, else "cpu": gpu_throttle needs root
    only for its CPU quota). A kind that needs root is refused to any other
    uid (``Fault._require_privilege``, the same rule), and to a root that
    lacks a capability the kind declares (a container's root without
    NET_ADMIN cannot use iptables), or whose program is in ``missing_tools``
    (``tools_missing``: not on PATH)."""
    missing_tools = set(missing_tools)
    out: dict[str, str] = {}
    for kind in kinds:
        cls = REGISTRY[kind]
        why = cls.root_reason_on(gpu_backend)
        if why is None:
            continue
        instead = f"; without root use {cls.without_root}" if cls.without_root else ""
        if euid != 0:
            out[kind] = (f"needs root (effective uid 0) and this harness runs as uid {euid} "
                         f"(why: {why}){instead}")
            continue
        gone = [t for t in cls.tools if t in missing_tools]
        if gone:
            out[kind] = (f"needs {', '.join(gone)}, which is not on this machine's PATH "
                         f"(install it: apt-get install {' '.join(gone)}){instead}")
            continue
        missing = [c for c in cls.capabilities
                   if cap_eff is not None and not cap_eff >> CAP_BITS[c] & 1]
        if missing:
            out[kind] = (f"needs {', '.join(missing)}, which this root harness lacks "
                         f"(CapEff {cap_eff:#x}) (why: {why}){instead}")
    return out
