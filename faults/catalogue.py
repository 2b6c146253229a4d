"""Every fault kind, imported once so the registry (``faults.base.REGISTRY``)
knows them all: heal-all, the schedule factory and ``python -m faults list``
rely on it. A new kind adds its module here (one module per kind)."""

from __future__ import annotations

import importlib

KINDS = (
    "network_partition", "network_latency", "packet_loss", "bandwidth_limit",
    "connection_reset", "clock_drift", "lsn_jump", "gpu_throttle",
    "gpu_memory_pressure", "process_kill", "process_pause", "http_fault",
)

for _kind in KINDS:
    importlib.import_module(f"faults.{_kind}")
