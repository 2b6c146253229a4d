"""Every fault kind, imported once so the registry (``faults.base.REGISTRY``)
knows them all: heal-all and ``python -m faults list`` rely on it.
A new kind adds one import here."""

from .process_kill import ProcessKill  # noqa: F401

KINDS_PLANNED = (
    "network_partition", "network_latency", "packet_loss", "bandwidth_limit",
    "connection_reset", "clock_drift", "lsn_jump", "gpu_throttle",
    "gpu_memory_pressure", "process_kill", "process_pause", "http_fault",
)
