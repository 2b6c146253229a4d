"""A replica's memory grows with every request and is never given back,
while it goes on answering: the process is killed by the kernel or its pod
limit hours later, far from the cause. Users saw vLLM's RAM (not GPU memory)
grow with every request until the server was killed: vllm-project/vllm#15597
(from 0.7.0, with ``n > 1``: an entry per request kept in
``seq_id_to_seq_group`` and never removed), QwenLM/Qwen2.5-Omni#351 (``vllm
serve``, RAM not freed after 4,000 requests, grows to the limit, killed);
SGLang tracks the same shape in sgl-project/sglang#9365 (memory increasing
continuously under requests until OOM).

Planted inside the last replica's API server through Ordeal's own
middleware (ordeal/planted.py): while the plant holds, every request the
server handles keeps a few MiB, every page written; removed, the next
request frees them. Nothing is announced: ``leak_bound`` must see it from
the monitor's RSS samples (baseline at the run's start against the drained
sample at its end)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ordeal import procfs
from ordeal.planted import leak_path

from ..node_processes import scope_pids
from .base import Shape, ZooCluster, local_log_dir

SOURCES = ("vllm-project/vllm#15597", "QwenLM/Qwen2.5-Omni#351", "sgl-project/sglang#9365")
#: Kept per request: at the zoo's 8 requests/s this is about 30 MiB/s, past
#: leak_bound's default bound (1.5 x the start + 256 MiB) within the load.
PER_REQUEST = 4 * 2**20
#: What counts as the plant having acted: the API server grew by this much.
GREW_MB = 128


def _rss_mb(pid: int) -> float:
    return procfs.status_kb(pid).get("VmRSS", 0) / 1024


@contextlib.contextmanager
def plant(cluster: ZooCluster) -> Iterator[dict[str, Any]]:
    node = cluster.replicas()[-1]
    log_dir = local_log_dir(node, "memory_leak")
    [api] = scope_pids(node, "api_server", "zoo memory_leak")
    path = leak_path(log_dir, node.name)
    evidence: dict[str, Any] = {"node": node.name, "pid": api, "per_request_bytes": PER_REQUEST,
                                "rss_mb_before": round(_rss_mb(api)), "hits": 0}
    path.write_text(str(PER_REQUEST))
    try:
        yield evidence
    finally:
        evidence["rss_mb_at_removal"] = round(_rss_mb(api))
        evidence["hits"] = int(evidence["rss_mb_at_removal"] - evidence["rss_mb_before"]
                               >= GREW_MB)
        path.unlink(missing_ok=True)


SHAPE = Shape(
    name="memory_leak",
    title="a replica's memory grows with every request and is never freed",
    sources=SOURCES,
    caught_by=("leak_bound",),
    how=f"the last replica's API server keeps {PER_REQUEST >> 20} MiB per request "
        "(Ordeal's middleware, ordeal/planted.py)",
    plant=plant)
