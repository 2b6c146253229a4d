"""Decode stalls while prefill and ``/health`` keep working: for one
stream in three the first token comes, then nothing, while every health
check answers. Users saw vLLM stuck with requests running and nothing
generated while it still answered health and metrics (vllm-project/vllm#2731),
and ``/health 200`` beside 0 tokens/s with a request running
(vllm-project/vllm#17972); a tensor-parallel rank hung in NCCL looks the
same from outside."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/vllm#2731", "vllm-project/vllm#17972")


def plant(cluster: ZooCluster):
    return toxic_on(cluster, "client-router", "sse_stall", "decode_stall",
                    {"after_events": 1, "stall_ms": 60_000, "every_nth": 3})


SHAPE = Shape(
    name="decode_stall",
    title="tokens stop after the first while /health answers",
    sources=SOURCES,
    caught_by=("error_rate", "goodput", "slo_latency"),
    how="fault proxy sse_stall (60 s after the first event) on every 3rd response, "
        "client-router link",
    plant=plant)
