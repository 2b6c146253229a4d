"""A hung backend stays in the router's rotation: one replica holds every
answer to real work while its ``/health`` still answers, so the router's
health checks keep it in rotation and every request routed to it waits out
its timeout. Users saw one unresponsive backend make the router hang on all
requests (vllm-project/production-stack#749), and a proxy whose health sweep
could not see an engine-core deadlock keep a hung backend in rotation for 85
minutes, every request spending its full 120 s timeout
(azrtydxb/Fastllm-proxy#19)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/production-stack#749", "azrtydxb/Fastllm-proxy#19")


def plant(cluster: ZooCluster):
    victim = cluster.replicas()[-1]
    return toxic_on(cluster, f"router-{victim.name}", "http_hold", "hung_backend_in_rotation",
                    {"hold_ms": 120_000, "spare_prefix": "/health"})


SHAPE = Shape(
    name="hung_backend_in_rotation",
    title="a hung backend whose /health answers stays in the router's rotation",
    sources=SOURCES,
    caught_by=("availability", "error_rate", "goodput"),
    how="fault proxy http_hold (every answer but /health) on the last replica's link",
    plant=plant)
