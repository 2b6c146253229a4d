"""A stream ends without ``finish_reason`` and without ``[DONE]``: the
response is well framed (no transport error), its events simply stop after
the second token. A client library that waits for ``[DONE]`` returns a
partial answer as if it were whole: vllm-metal #199 (a stream went
silent with no ``[DONE]``), vLLM #27572 (``finish_reason`` null), pydantic-ai
#6610 (a stream closed without either was taken as complete)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/vllm-metal#199", "vllm-project/vllm#27572", "pydantic/pydantic-ai#6610")


def plant(cluster: ZooCluster):
    return toxic_on(cluster, "client-router", "sse_cut", "stream_cut_without_done",
                    {"after_events": 2, "fabricate": False, "every_nth": 3})


SHAPE = Shape(
    name="stream_cut_without_done",
    title="a stream ends with no finish_reason and no [DONE]",
    sources=SOURCES,
    caught_by=("stream_wellformed",),
    how="fault proxy sse_cut (after 2 events) on every 3rd response, client-router link",
    plant=plant)
