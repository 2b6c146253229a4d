"""A stream cut short that looks complete: after the second token a proxy
ends it with a chunk of its own that says ``finish_reason: "stop"``, then
``[DONE]``. Nothing in the framing is wrong; the answer is shorter than the
engine made it, and no usage chunk comes: LiteLLM #33404 (an upstream
reset became a synthetic ``finish_reason: stop`` + ``[DONE]``), #40260 (an EOF
without ``finish_reason`` reported as a successful completion)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("BerriAI/litellm#33404", "BerriAI/litellm#40260")


def plant(cluster: ZooCluster):
    return toxic_on(cluster, "client-router", "sse_cut", "truncation_looks_complete",
                    {"after_events": 2, "fabricate": True, "every_nth": 3})


SHAPE = Shape(
    name="truncation_looks_complete",
    title="a truncated stream ends with a fabricated finish_reason \"stop\"",
    sources=SOURCES,
    caught_by=("stream_wellformed", "usage_matches_tokens", "canary_determinism"),
    how="fault proxy sse_cut fabricate=true (after 2 events) on every 3rd response, "
        "client-router link",
    plant=plant)
