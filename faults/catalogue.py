"""The registry of fault kinds: every kind's class, by name. heal-all, the
schedule factory and ``python -m faults list|catalogue`` look kinds up
here. A new kind adds its class here (one module per kind); nothing in
faults/ but this module, the factory, heal-all and the CLI imports it, so the
kinds' modules never depend on one another through it."""

from __future__ import annotations

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
