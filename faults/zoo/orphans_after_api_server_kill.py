"""Child processes outlive a killed API server: a SIGKILL of vLLM's API
server alone (a supervisor's forced stop, the OOM killer, a crash) leaves its
EngineCore and the engine's workers running, holding their memory and the
GPU, while the port is free and the node looks stopped; the next start then
fails its KV-cache check or runs out of memory. Users saw it in
vllm-project/vllm#55510 (EngineCore and TP workers survive a SIGKILLed API
server and keep the GPUs), vllm-project/vllm#19849 (an orphaned EngineCore
blocks every restart; the fix attempt vllm-project/vllm#21915) and
ROCm/ATOM#1511 (orphaned engine workers pin VRAM after the parent's abnormal
exit). On this machine's vLLM the EngineCore, its worker and its
resource_tracker lived on for 46 minutes (suites/known_findings).

Planted by a SIGKILL of the last replica's API server, by its pid, with no
fault window: ``no_orphans`` must see from the monitor's samples that the
node's main process is gone while processes of its group run on past the
orphan bound. The plant's removal ends the orphans by pid (each only if it
is still the recorded process) and starts the replica again, so the
cluster serves the next run."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from ordeal.topology import NodeNotReady

from ..base import FaultError
from ..node_processes import is_same, node_members, proc_names, scope_pids
from ..process_kill import end_members, wait_until
from .base import Shape, ZooCluster

SOURCES = ("vllm-project/vllm#55510", "vllm-project/vllm#19849", "ROCm/ATOM#1511")
#: How long the replica's restart after the plant may take (a CPU replica
#: here starts in 25-45 s; on a loaded machine twice that).
READY_TIMEOUT_S = 240.0


@contextlib.contextmanager
def plant(cluster: ZooCluster) -> Iterator[dict[str, Any]]:
    node = cluster.replicas()[-1]
    if getattr(node, "container_id", None) is not None or not hasattr(node, "start"):
        raise FaultError(f"zoo orphans_after_api_server_kill: {node.name} is not a process "
                         "group Ordeal started on this machine")
    members = node_members(node)
    [api] = scope_pids(node, "api_server", "zoo orphans_after_api_server_kill")
    evidence: dict[str, Any] = {"node": node.name, "api_server": api,
                                "members": [m.pid for m in members], "hits": 0}
    killed_at = time.monotonic()
    os.kill(api, signal.SIGKILL)
    try:
        yield evidence
    finally:
        alive = [m for m in members if m.pid != api and is_same(m)]
        evidence["orphans"] = [{"pid": m.pid, "names": proc_names(m.pid)[:80]} for m in alive]
        evidence["alive_after_kill_s"] = round(time.monotonic() - killed_at, 1)
        evidence["hits"] = len(alive)
        evidence["ended"] = end_members(alive)
        wait_until(lambda: not node.is_running(), 30.0)
        t0 = time.monotonic()
        node.start()
        try:
            node.wait_ready(READY_TIMEOUT_S)
            evidence["restarted_after_s"] = round(time.monotonic() - t0, 1)
        except NodeNotReady as e:
            evidence["restart_failed"] = str(e)


SHAPE = Shape(
    name="orphans_after_api_server_kill",
    title="child processes outlive a killed API server (orphans)",
    sources=SOURCES,
    caught_by=("no_orphans",),
    how="SIGKILL of the last replica's API server alone, unannounced; its EngineCore "
        "and workers are left to themselves",
    plant=plant)
