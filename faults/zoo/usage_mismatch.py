"""Token usage in the response does not match the tokens streamed: the
usage chunk counts one completion token more than the stream carried, the
count a client bills by: vLLM #8625 (streamed usage said
``completion_tokens`` 1 whatever was streamed), LiteLLM #1304 (the same answer
counted differently streamed and not)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/vllm#8625", "BerriAI/litellm#1304")


def plant(cluster: ZooCluster):
    return toxic_on(cluster, "client-router", "sse_rewrite_usage", "usage_mismatch",
                    {"delta": 1, "every_nth": 3})


SHAPE = Shape(
    name="usage_mismatch",
    title="usage.completion_tokens differs from the tokens streamed",
    sources=SOURCES,
    caught_by=("usage_matches_tokens",),
    how="fault proxy sse_rewrite_usage (+1) on every 3rd response, client-router link",
    plant=plant)
