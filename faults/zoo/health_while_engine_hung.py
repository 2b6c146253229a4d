"""``/health`` answers 200 while the engine is hung: vLLM's EngineCore of
one replica is stopped (SIGSTOP, the state a deadlocked or stalled engine
process is in) behind its live API server. The API server keeps answering
``/health`` and ``/v1/models``; the router keeps the replica in rotation;
no token comes from it. Users saw this as requests that hang on one replica
while every health check is green: vLLM #39863 (EngineCore died
silently, the API server answered health checks, throughput 0), #16259 (a
stream of ``GET /health 200`` after Ray workers crashed), SGLang #6624."""

from __future__ import annotations

from .base import Shape, ZooCluster, stopped

SOURCES = ("vllm-project/vllm#39863", "vllm-project/vllm#16259", "sgl-project/sglang#6624")


def plant(cluster: ZooCluster):
    return stopped(cluster.replicas()[-1], "engine_core", "zoo health_while_engine_hung")


SHAPE = Shape(
    name="health_while_engine_hung",
    title="/health answers 200 while the engine process is hung",
    sources=SOURCES,
    caught_by=("health_truthful",),
    how="SIGSTOP of the last replica's EngineCore (its API server runs on)",
    plant=plant)
