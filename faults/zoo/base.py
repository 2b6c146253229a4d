"""What a shape of the failure zoo is, and the two ways this package plants
one inside the serving path without telling the checkers: a toxic on one of
the fault proxy's links (added straight through the proxy's control API, so
no nemesis op and no fault window is recorded), or a signal to processes of
one node. The checkers must find the shape from the history and the nodes'
own evidence alone (issue 40)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol

from ordeal import procfs
from ordeal.topology import Link, Node

from ..base import FaultError
from ..node_processes import scope_pids
from ..proxy.client import ProxyClient


class ZooCluster(Protocol):
    """What a shape needs of the cluster it is planted in."""

    def link(self, name: str) -> Link: ...

    def replicas(self) -> list[Node]: ...


#: A plant: a context manager that plants the shape on entry, yields a dict
#: of evidence (filled in further on exit: what the plant did) and removes
#: the shape on exit, whatever happened.
Plant = Callable[[ZooCluster], ContextManager[dict[str, Any]]]


@dataclass(frozen=True)
class Shape:
    name: str
    title: str  # what users saw, in one line
    sources: tuple[str, ...]  # public reports it imitates: "owner/repo#number"
    caught_by: tuple[str, ...]  # the invariants whose failure counts as caught
    how: str  # how it is planted, in one line (for the table)
    plant: Plant


def local_log_dir(node: Node, shape: str) -> Path:
    """The directory of a replica's log, where Ordeal's middleware inside it
    looks for what a shape planted (ordeal/planted.py); FaultError for a
    node Ordeal did not start on this machine."""
    log_path = getattr(getattr(node, "process", None), "log_path", None)
    if log_path is None:
        raise FaultError(f"zoo {shape}: {node.name} is not a process Ordeal started on this "
                         "machine (the shape is planted through Ordeal's own middleware)")
    return Path(log_path).parent


@contextlib.contextmanager
def toxic_on(cluster: ZooCluster, link_name: str, toxic_type: str, name: str,
             attributes: dict[str, Any], toxicity: float = 1.0) -> Iterator[dict[str, Any]]:
    """A toxic on ``link_name`` while the block runs; the evidence is the
    toxic's own counters when it was removed (``hits``: events or responses
    it changed)."""
    link = cluster.link(link_name)
    proxy = ProxyClient(link.control)
    evidence: dict[str, Any] = {"link": link_name, "toxic": toxic_type,
                                "attributes": attributes, "toxicity": toxicity}
    proxy.add_toxic(link.name, toxic_type, name=f"zoo-{name}", attributes=attributes,
                    toxicity=toxicity)
    try:
        yield evidence
    finally:
        gone = proxy.take_toxic(link.name, f"zoo-{name}") or {}
        evidence["counters"] = gone.get("counters", {})
        evidence["hits"] = int(evidence["counters"].get("hits", 0))


@contextlib.contextmanager
def stopped(node: Node, scope: str, kind: str) -> Iterator[dict[str, Any]]:
    """SIGSTOP the node's processes of ``scope`` (faults/node_processes.py)
    while the block runs, SIGCONT them after; the evidence names the pids
    and how many were seen stopped (state T in /proc)."""
    pids = scope_pids(node, scope, kind)
    evidence: dict[str, Any] = {"node": node.name, "scope": scope, "pids": pids, "hits": 0}
    stopped_pids: list[int] = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped_pids.append(pid)
            except ProcessLookupError:
                pass
        evidence["hits"] = _wait_stopped(stopped_pids)
        yield evidence
    finally:
        for pid in stopped_pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass



def _wait_stopped(pids: list[int], within_s: float = 2.0) -> int:
    """How many of ``pids`` /proc shows stopped, once all are or after
    ``within_s`` (a signal is delivered when the process is next scheduled)."""
    deadline = time.monotonic() + within_s
    while True:
        n = sum(1 for pid in pids if procfs.state(pid) in ("T", "t"))
        if n == len(pids) or time.monotonic() > deadline:
            return n
        time.sleep(0.05)
