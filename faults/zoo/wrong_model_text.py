"""One replica answers with another model's text under the same model name:
every answer that replica gives reads differently from the same request's
answer on the others (a wrong checkpoint or LoRA behind one replica, a stale
pod after a rollout): vLLM #7260 (a LoRA's answer labelled as the base
model), AIBrix #397 (a gateway answered for a model name it should have
refused), LiteLLM #38216 (requests balanced across unrelated model groups)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("vllm-project/vllm#7260", "vllm-project/aibrix#397", "BerriAI/litellm#38216")


def plant(cluster: ZooCluster):
    victim = cluster.replicas()[-1]
    return toxic_on(cluster, f"router-{victim.name}", "sse_rewrite_text", "wrong_model_text",
                    {"after_events": 0, "text": " and"}, toxicity=1.0)


SHAPE = Shape(
    name="wrong_model_text",
    title="one replica answers with another model's text under the same name",
    sources=SOURCES,
    caught_by=("canary_determinism",),
    how="fault proxy sse_rewrite_text on every response of the last replica's link",
    plant=plant)
