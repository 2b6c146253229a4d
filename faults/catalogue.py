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

#: Kinds that only one backend has, kept out of KINDS (the endurance
#: catalogue and every backend run those): ``--cluster ray``'s node faults.
BACKEND_KINDS = {"ray_node_loss": "ray_node", "ray_node_pause": "ray_node",
                 "ray_node_partition": "ray_node"}

for _kind in KINDS:
    importlib.import_module(f"faults.{_kind}")
for _module in set(BACKEND_KINDS.values()):
    importlib.import_module(f"faults.{_module}")
