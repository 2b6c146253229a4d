"""Greedy (temperature 0) answers to identical requests diverge: from the
fourth token on, a share of answers carries other text in a well-formed
stream (token ids and usage unchanged), as greedy output does after a
KV-cache block is corrupted: vLLM #40896 and #7845 (prefix caching:
identical temperature-0 requests answered differently), #39146 (a corrupted
KV block)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/vllm#40896", "vllm-project/vllm#7845", "vllm-project/vllm#39146")


def plant(cluster: ZooCluster):
    return toxic_on(cluster, "client-router", "sse_rewrite_text", "greedy_diverges",
                    {"after_events": 3, "text": "~", "every_nth": 3})


SHAPE = Shape(
    name="greedy_diverges",
    title="greedy outputs of identical requests diverge (KV-cache corruption)",
    sources=SOURCES,
    caught_by=("canary_determinism",),
    how="fault proxy sse_rewrite_text (from event 3) on every 3rd response, client-router link",
    plant=plant)
