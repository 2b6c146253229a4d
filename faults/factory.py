"""From a schedule's words (kind, target spec, params) to Fault objects on a
live cluster. Pure lookup plus target selection; the faults themselves act.

Node kinds take a node (a replica, or the router when named); link kinds
take a link of the fault proxy (``client-router``, ``router-replica-0``);
a backend's own kinds take that backend's nodes (``ray-node-0``). On an
external deployment (``--cluster external``) the node kinds are the target
file's hooks (faults/hook.py), made by the cluster's ``hook_fault``.
"""

from __future__ import annotations

import inspect
import random
from typing import Any

from ordeal import kinds
from ordeal.topology import Cluster

from .base import Fault, FaultError
from .catalogue import REGISTRY
from .ledger import Ledger
from .sequence_jump import SequenceJump
from .targets import select


def rank_device(kind: str, node: Any, rank: Any, device: Any) -> int:
    """The GPU of tensor-parallel rank ``rank`` of a GPU vLLM replica (its
    ``gpu_devices``, engines/vllm/gpus.py), for a GPU fault on that rank
    only (issue 45); FaultError, before anything changes, where there is
    no such rank."""
    devices = tuple(getattr(node, "gpu_devices", None) or ())
    if device is not None:
        raise FaultError(f"{kind}: give rank={rank!r} or device={device!r}, not both")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise FaultError(f"{kind}: rank={rank!r}: give a tensor-parallel rank, 0 or more")
    if not devices:
        raise FaultError(f"{kind}: rank={rank} picks a GPU of a replica run with tensor "
                         f"parallelism, and {getattr(node, 'name', node)} has no GPU placement "
                         "(the CPU build, or not a vLLM replica)")
    if rank >= len(devices):
        raise FaultError(f"{kind}: rank={rank}: {node.name} has tensor-parallel rank(s) "
                         f"0..{len(devices) - 1} (GPUs {list(devices)})")
    return devices[rank]


def fault_class(kind: str) -> type[Fault]:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise FaultError(f"unknown fault kind {kind!r}; known kinds: "
                         f"{', '.join(sorted(REGISTRY))}") from None


def _backend_targets(kind: str, target: str, cluster: Cluster, rng: random.Random) -> list[Any]:
    """A backend's own kinds (``ray_node_*``) act on that backend's nodes
    (``cluster.ray_nodes``: the simulated Ray worker nodes), chosen by the
    same words or named (``ray-node-0``)."""
    nodes = list(getattr(cluster, "ray_nodes", None) or [])
    if not nodes:
        raise FaultError(f"{kind} acts on simulated Ray nodes: run with --cluster ray (this "
                         f"cluster is {getattr(cluster, 'backend', '?')!r}, or joined an "
                         "existing Ray cluster whose nodes the suite does not own)")
    by_name = {n.name: n for n in nodes}
    return [by_name[n] for n in select(target, list(by_name), rng)]


def build_faults(kind: str, target: str, cluster: Cluster, run_id: str, ledger: Ledger,
                 rng: random.Random, params: dict[str, Any] | None = None) -> list[Fault]:
    """One Fault per chosen target. Mode words (one, minority, majority, all)
    choose among replicas (node kinds) or links (link kinds); explicit names
    may also name the router."""
    cls = fault_class(kind)
    params = dict(params or {})
    why = getattr(cluster, "unsupported", lambda _kind: None)(kind)
    if why:  # an external deployment: neither a hook nor the proxy acts for this kind
        raise FaultError(f"{kind} cannot act on this cluster: {why}")
    jump_file = getattr(cluster, "sequence_jump_file", None)
    if kind == "lsn_jump" and jump_file is not None:
        # An engine whose sequences are request chains (Triton): the jump
        # acts on the client's sequence steps, named by the link it stands on.
        names = select(target, [x.name for x in cluster.links], rng) if cluster.links else [target]
        try:
            return [SequenceJump(n, run_id, ledger, jump_file, **params) for n in names[:1]]
        except TypeError as e:
            raise FaultError(f"lsn_jump: bad parameters {params} ({e})") from None
    traits = kinds.of(kind)
    if traits is None:  # a registered class always declares its traits
        raise FaultError(f"fault kind {kind!r} declares no traits")
    if traits.on_link:
        links = list(cluster.links)
        if not links:
            raise FaultError(f"{kind} acts on the fault proxy's links, and this cluster has "
                             "none: start it with the fault proxy on")
        if traits.acts_on == "l7_link":  # a Toxiproxy link carries bytes only
            links = [x for x in links if x.api == "ordeal"] or links
        names = select(target, [x.name for x in links], rng)
        objs: list[Any] = [cluster.link(n) for n in names]
    elif traits.backends:
        objs = _backend_targets(kind, target, cluster, rng)
    else:
        pool = [n.name for n in (cluster.replicas() if target in ("one", "minority", "majority",
                                                                  "all") else cluster.nodes)]
        hooked = getattr(cluster, "hooked", None)
        if hooked is not None and target in ("one", "minority", "majority", "all"):
            # An external deployment: choose among the nodes a hook acts on.
            pool = [n for n in pool if n in hooked(kind)] or pool
        objs = [cluster.node(n) for n in select(target, pool, rng)]
    hook_fault = getattr(cluster, "hook_fault", None)
    if hook_fault is not None and not traits.on_link:
        # An external deployment's node: the target file's hooks act on it.
        return [hook_fault(kind, obj, run_id, ledger, params) for obj in objs]
    out = []
    for obj in objs:
        own = dict(params)
        placed = getattr(obj, "gpu_device", None)  # a GPU vLLM replica's own GPU
        if traits.on_gpu and "rank" in own:
            own["device"] = rank_device(kind, obj, own.pop("rank"), own.get("device"))
        elif traits.on_gpu and "device" not in own and placed is not None:
            own["device"] = placed
        try:
            out.append(cls(obj, run_id, ledger, **own))
        except TypeError as e:
            sig = inspect.signature(cls.__init__)
            raise FaultError(f"{kind}: bad parameters {params} ({e}); it takes "
                             f"{', '.join(list(sig.parameters)[4:]) or 'no parameters'}") from None
    return out
