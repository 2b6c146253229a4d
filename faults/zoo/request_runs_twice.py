"""A request runs twice after a router retry: the replica's answers are
reset by the network as their first bytes leave it, and the router sends
the request again, to a replica that then runs it a second time (the
replica's served journal shows both). Users saw a retrying sidecar replay
non-idempotent POSTs that had connected fine (istio/istio#13851), and one
paid generation run, and billed, four times after retries
(Comfy-Org/ComfyUI#16204). vllm-router does this under resets on its
replica links (the known finding of the embedded stack, bounded to a
connection_reset window it was told of; here nothing is announced)."""

from __future__ import annotations

from .base import Shape, ZooCluster, toxic_on

SOURCES = ("istio/istio#13851", "Comfy-Org/ComfyUI#16204")


def plant(cluster: ZooCluster):
    victim = cluster.replicas()[-1]
    return toxic_on(cluster, f"router-{victim.name}", "reset_peer", "request_runs_twice",
                    {"timeout_ms": 0})


SHAPE = Shape(
    name="request_runs_twice",
    title="a request runs twice after the router retries it",
    sources=SOURCES,
    caught_by=("no_duplicate_execution",),
    how="fault proxy reset_peer (at the first bytes of each answer) on the last replica's "
        "link; the router's retries do the rest",
    plant=plant)
