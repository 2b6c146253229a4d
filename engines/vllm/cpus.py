"""Which cores each vLLM replica Ordeal starts runs on (``--replica-cpus``).

Each replica's compute threads are bound to one core of its own
(``VLLM_CPU_OMP_THREADS_BIND``): vLLM's "auto" binding put every replica's
compute on the same first core. By default (``own``) the replica's whole
process tree (API server, engine core, worker) is confined to its own
core(s) too, as replicas on separate machines or GPUs would be. Why:
``import torch`` counts the machine's cores through MKL by pinning the
importing thread to each core in turn, and vLLM runs ``lscpu``, which does
the same. With another replica's worker keeping its core busy, every such
visit waited for that core: measured here (2 cores, the kill smoke's load),
``import torch`` took 13.7 s instead of 2.8 s, and the killed replica's
restart 158-260 s instead of 30 s, against a 240 s bound. ``shared`` keeps
the earlier placement (only the compute threads bound). Cores left over
when the count does not divide go to no replica; the harness, router and
fault proxy may run anywhere. Pure planning: the backends apply it
(``nodes.process.ManagedProcess`` by affinity, Docker by cpuset).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaCpus:
    compute: int  # the core its compute threads are bound to
    allowed: tuple[int, ...] | None  # where its processes may run; None: every core


def replica_cpus(cores: Sequence[int], replicas: int, index: int,
                 mode: str = "own") -> ReplicaCpus:
    """Replica ``index`` of ``replicas`` on the machine's ``cores`` (this
    harness's affinity): an equal slice each when there are enough, else
    one core each, shared round-robin."""
    if not cores or replicas < 1:
        raise ValueError(f"no cores ({list(cores)}) or replicas ({replicas}) to place")
    cores = sorted(cores)
    if len(cores) >= replicas:
        per = len(cores) // replicas
        mine = tuple(cores[index * per:(index + 1) * per])
    else:
        mine = (cores[index % len(cores)],)
    return ReplicaCpus(compute=mine[0], allowed=mine if mode == "own" else None)
