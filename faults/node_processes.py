"""The processes of a node, as faults act on them: which ones a scope
means, and how each is recorded so that a later heal (or heal-all after a
crash) touches that process and never a later one that reuses its pid.

Scopes (``process_kill`` and ``process_pause``): failures as they really
happen take one process, not a group. The OOM killer ends the largest
process (a vLLM engine core), a crash ends the API server alone.

- ``node``: the node's whole process group (API server, EngineCore, workers);
- ``api_server``: the group's leader, the process the suite started (vLLM's
  API server; for another engine, its main process);
- ``engine_core``: the members whose name or command line says EngineCore
  (vLLM's engine process, which renames itself "VLLM::EngineCore");
- ``rank:N``: the worker process(es) of tensor-parallel rank N (issue 45).
  vLLM's multiprocessing executor titles each worker "VLLM::Worker" plus a
  segment per parallel dimension larger than one ("VLLM::Worker_TP1",
  "VLLM::Worker_PP0_TP1_EP1"): rank N is the ``_TP<N>`` segment, or, without
  tensor parallelism, the one plain "VLLM::Worker" as rank 0, and where no
  worker process exists (vLLM's single-process executor, a GPU replica
  without tensor parallelism) the EngineCore that runs rank 0's worker. A
  rank that hangs (in NCCL, on a GPU) stops decoding while /health says 200.

One trap, seen: vLLM's EngineCore renames itself with setproctitle, which
overwrites the memory /proc/<pid>/environ reads, so its label is gone. Such
a process carries the label of its group leader (the process the suite
spawned, which keeps its environment).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from ordeal import procfs
from ordeal.ownership import CLUSTER_ENV, NODE_ENV, record_of_group
from ordeal.topology import Node

from .base import FaultError

SCOPES = ("node", "api_server", "engine_core", "rank:N")
ENGINE_CORE = "EngineCore"
_RANK_SCOPE = re.compile(r"rank:(\d{1,4})")
#: A vLLM worker's title: "::Worker" and its ``_<DIM><rank>`` segments, up to
#: a space or the end ("VLLM::Worker_TP" alone is a comm cut at 15 bytes).
_WORKER = re.compile(r"::Worker((?:_[A-Z]+\d+)*)(?=\s|$)")
_SEGMENT = re.compile(r"_([A-Z]+)(\d+)")


def check_scope(scope: str, kind: str) -> None:
    """FaultError, before anything changes, for a scope that is not one of
    ``SCOPES`` (``rank:N`` with N a whole number)."""
    if scope in SCOPES[:3] or _RANK_SCOPE.fullmatch(scope):
        return
    raise FaultError(f"{kind}: scope {scope!r} is unknown; use one of {', '.join(SCOPES)} "
                     "(node: the whole process group; rank:N: tensor-parallel rank N's "
                     "worker, e.g. rank:1)")


def worker_ranks(names: str) -> set[int]:
    """The tensor-parallel ranks a process's names (``proc_names``) say it
    is the worker of: {N} for "VLLM::Worker_TP<N>..." (other dimensions'
    segments aside), {0} for a plain "VLLM::Worker", none for any other."""
    ranks = set()
    for m in _WORKER.finditer(names):
        dims = {d: int(n) for d, n in _SEGMENT.findall(m.group(1))}
        ranks.add(dims.get("TP", 0))
    return ranks


@dataclass(frozen=True)
class Member:
    """One process of a node, as it was when a fault recorded it."""

    pid: int
    start_time: str
    pgid: int
    label: str  # its cluster id (ordeal.ownership.CLUSTER_ENV)


def proc_label(pid: int) -> str | None:
    return procfs.environ(pid).get(CLUSTER_ENV)


def recorded_label(pgid: int) -> str | None:
    """The cluster id of the process record the suite wrote when it started
    the group (ordeal.ownership), if its leader is still that process."""
    rec = record_of_group(pgid)
    return rec.cluster_id if rec is not None else None


def cluster_label(pid: int) -> str | None:
    """The process's cluster label; for one whose environment block was
    overwritten (setproctitle), its group leader's; for a group whose
    environments cannot be read at all (a non-root harness may not read
    /proc/<pid>/environ of a process that made itself non-dumpable, as
    vllm-router does), the label of the suite's record of that group."""
    own = proc_label(pid)
    if own is not None:
        return own
    pgid = procfs.pgid(pid)
    if pgid is None:
        return None
    return (proc_label(pgid) if pgid != pid else None) or recorded_label(pgid)


def proc_names(pid: int) -> str:
    """comm and command line of a process, as one string ("" if gone): what
    ``only`` matches. EngineCore renames itself, so its comm is
    "VLLM::EngineCor" (cut at 15 bytes) and its cmdline "VLLM::EngineCore"."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return ""
    return f"{comm} {cmdline.decode(errors='replace').strip()}"


def snapshot(pids: list[int]) -> list[Member]:
    """Members as the ledger keeps them; processes already gone, and those
    without a label, are left out."""
    out = []
    for pid in pids:
        start, pgid, label = procfs.start_time(pid), procfs.pgid(pid), cluster_label(pid)
        if start is not None and pgid is not None and label is not None:
            out.append(Member(pid, start, pgid, label))
    return out


def is_same(member: Member) -> bool:
    """The recorded process, and not a later one that reuses its pid: the
    pid with its start time names one process per boot. The label must
    still match where it can be read; it cannot be once a member that
    overwrote its environment (vLLM's "VLLM::EngineCore") has lost its group
    leader, and such a member is then still ours (CI, 2026-12-03: an
    EngineCore outlived its SIGKILLed API server for 46 minutes, unseen by
    the orphan check and by every teardown, because its label read None)."""
    if (procfs.start_time(member.pid) != member.start_time
            or procfs.pgid(member.pid) != member.pgid):
        return False
    label = cluster_label(member.pid)
    return label is None or label == member.label


def scope_pids(node: Node, scope: str, kind: str) -> list[int]:
    """The live pids of ``node`` that ``scope`` means; FaultError naming the
    node's members when the scope matches none of them (a Triton server has
    no EngineCore), or when the scope is unknown."""
    check_scope(scope, kind)
    pids = node.pids()
    leader = getattr(node, "pid", None)
    if scope == "node":
        return pids
    rank = _RANK_SCOPE.fullmatch(scope)
    if scope == "api_server":
        chosen = [p for p in pids if p == leader]
    elif rank is not None:
        names = {p: proc_names(p) for p in pids}
        chosen = [p for p in pids if int(rank.group(1)) in worker_ranks(names[p])]
        if not chosen and rank.group(1) == "0" and not any(map(worker_ranks, names.values())):
            # One GPU, no tensor parallelism: vLLM's single-process executor
            # runs rank 0's worker inside the EngineCore process.
            chosen = [p for p in pids if ENGINE_CORE in names[p]]
    else:
        chosen = [p for p in pids if ENGINE_CORE in proc_names(p)]
    if pids and not chosen:
        found = ", ".join(f"{p} ({proc_names(p)[:60] or 'gone'})" for p in pids)
        raise FaultError(f"{kind}: scope {scope!r} matches no process of {node.name}; its "
                         f"members are: {found}")
    return chosen


def labelled_pids(cluster_id: str, node_name: str) -> list[int]:
    """Live processes that carry the node's labels (its cluster id and name,
    which every process it starts inherits): its members, and any that left
    its process group (a worker that called setsid), which a group kill
    misses."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = procfs.environ(int(entry.name))
        if env.get(CLUSTER_ENV) == cluster_id and env.get(NODE_ENV) == node_name \
                and procfs.start_time(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def node_members(node: Node) -> list[Member]:
    """Every process of the node, recorded: its group, and the processes
    that carry its labels outside the group."""
    pids = set(node.pids())
    leader = getattr(node, "pid", None)
    cluster = cluster_label(leader) if leader else None
    if cluster is not None:
        pids |= set(labelled_pids(cluster, node.name))
    return snapshot(sorted(pids))


def kill_members(members: list[Member]) -> list[int]:
    """SIGKILL each member that is still the recorded process (never a later
    one that reuses its pid). Returns the pids signalled."""
    killed = []
    for m in members:
        if is_same(m):
            try:
                os.kill(m.pid, signal.SIGKILL)
                killed.append(m.pid)
            except ProcessLookupError:
                pass
    return killed
