"""process_kill: SIGKILL a node's processes, optionally restart it.

``scope`` (faults/node_processes.py) says which: ``node`` (the default) is
the node's whole process group (the engine's API server, its EngineCore and
its workers together), as a crashed host would leave it; ``api_server`` or
``engine_core`` is the one process a crash or the OOM killer really takes,
each by its recorded pid. There is nothing to undo (the processes are
gone); a live heal restarts the node and waits until it serves again
(``_recover``), so the heal's duration is the node's recovery time.

Orphans. A process of the killed node that lives on (an engine whose API
server died, a worker outside the group) holds memory, a GPU and the port,
and the restart then fails or runs beside it. Before it restarts the node,
the heal (``_aftermath``, before ``undo``) waits until ``orphan_bound_s``
after the kill for every process the inject recorded to be gone; those
still alive then are the heal's ``orphans`` (invariants.no_orphans judges
them), and are ended by pid so the restart can run. After a crash, heal-all ends the recorded processes still
alive (``undo``), each only if it is still the recorded process.
"""

from __future__ import annotations

import signal
import socket
import time
from dataclasses import asdict
from typing import Any, Callable

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.procfs import group_members
from ordeal.topology import Endpoint, Node, NodeNotReady

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .node_processes import (
    Member,
    check_scope,
    is_same,
    kill_members,
    node_members,
    proc_names,
    scope_pids,
)
from .safety import down_detail


def connect_state(endpoint: Endpoint, timeout_s: float = 2.0) -> str:
    """What a TCP connect to the endpoint meets: "refused" (nothing
    listens: a killed node), "accepted" (something serves the port), or
    "timeout"/the error (the node, or the path to it, swallows packets)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def wait_gone(members: list[Member], timeout_s: float) -> list[int]:
    """Wait (at most ``timeout_s``) until none of ``members`` is still the
    recorded process; the pids still alive then."""
    wait_until(lambda: not any(is_same(m) for m in members), timeout_s)
    return [m.pid for m in members if is_same(m)]


def end_members(members: list[Member], timeout_s: float = 10.0) -> list[int]:
    """SIGKILL each member that is still the recorded process, and wait
    until they are gone. Returns the pids it signalled."""
    ended = kill_members(members)
    wait_gone(members, timeout_s)
    return ended


class ProcessKill(Fault):
    kind = "process_kill"
    traits = KindTraits(kind, stops_target=True, restarts_target=True, hookable=True,
                        endurance=EnduranceChoice("one", position=11))
    needs_root = False
    privilege = (
        "sends SIGKILL to the node's own process group and restarts it; the harness "
        'started the node as its own user')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, restart: bool = True,
                 ready_timeout_s: float = 300.0, gone_within_s: float = 60.0,
                 scope: str = "node", orphan_bound_s: float = 10.0):
        super().__init__(node.name, run_id, ledger)
        check_scope(scope, self.kind)
        if orphan_bound_s < 0:
            raise FaultError(f"process_kill: orphan_bound_s={orphan_bound_s} must be 0 or more "
                             "seconds")
        self.node = node
        self.restart = restart
        self.ready_timeout_s = ready_timeout_s
        # How long the killed tree may take to be gone, as the node's state
        # shows it: on a busy machine a container's exit can come well after
        # Docker's own 10 s wait for it.
        self.gone_within_s = gone_within_s
        self.scope = scope
        self.orphan_bound_s = orphan_bound_s
        self._victims: list[int] = []
        self._killed_at: float | None = None  # monotonic

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """End what is left of the node's recorded processes, each only if it
        is still that process (pid, start time, group, label). In a live run
        ``_recover`` has ended them already; after a crash, the rest of the
        node's tree is also ended by id by heal-all and at the next suite
        start (ordeal.ownership.reap_leftovers)."""
        members = [Member(**m) for m in entry.inverse.get("members", [])]
        return {"ended": end_members(members)} if members else {}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        ended = done.get("ended")
        what = f"ended its processes still alive {ended}" if ended else "nothing was left"
        return f"{healed(entry, 'closed')}: {what}; its cluster is gone, nothing to restart"

    def _preflight(self) -> None:
        if not self.node.is_running():
            raise FaultError(f"process_kill: {self.node.name} is not running"
                             f"{down_detail(self.node)}; nothing to kill (heal it first, or "
                             "pick a live node)")
        self._victims = scope_pids(self.node, self.scope, self.kind)

    def _inverse(self) -> dict[str, Any]:
        members = node_members(self.node)
        return {"action": "restart" if self.restart else "none", "node": self.node.name,
                "scope": self.scope, "victims": list(self._victims),
                "members": [asdict(m) for m in members]}

    def _members(self) -> list[Member]:
        assert self.entry is not None
        return [Member(**m) for m in self.entry.inverse.get("members", [])]

    def _act(self) -> dict[str, Any]:
        """SIGKILL, then confirm from the node's state (the killed processes
        gone) within ``gone_within_s``; what the engine that carried the
        signal said is recorded, never taken as the verdict."""
        if self.scope != "node":
            return self._kill_one()
        pid = getattr(self.node, "pid", None)
        t0 = self._killed_at = time.monotonic()
        said = self.node.signal(signal.SIGKILL)
        deadline = t0 + self.gone_within_s

        def alive() -> list[int]:
            # The leader's exit is not the tree's: a child with a large
            # address space (vLLM's EngineCore) takes a moment longer to die.
            leader = [pid] if self.node.is_running() and pid else []
            return leader or (group_members(pid) if pid else [])
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if left := alive():
            raise RuntimeError(f"{self.node.name} (group {pid}): {left} still run "
                               f"{self.gone_within_s:.0f} s after SIGKILL"
                               + (f"; the engine said: {said}" if said else ""))
        done: dict[str, Any] = {"signal": "SIGKILL", "scope": "node", "pid": pid,
                                "gone_after_s": round(time.monotonic() - t0, 2)}
        if said:
            done["engine_said"] = said
        return done

    def _kill_one(self) -> dict[str, Any]:
        """The scope's processes only, each by its recorded pid."""
        victims = [m for m in self._members() if m.pid in self._victims]
        names = {m.pid: proc_names(m.pid)[:60] for m in victims}
        t0 = self._killed_at = time.monotonic()
        kill_members(victims)
        left = wait_gone(victims, self.gone_within_s)
        if left:
            raise RuntimeError(f"{self.node.name}: {left} still run {self.gone_within_s:.0f} s "
                               f"after SIGKILL ({self.scope})")
        return {"signal": "SIGKILL", "scope": self.scope, "pid": getattr(self.node, "pid", None),
                "killed": [m.pid for m in victims], "killed_names": names,
                "gone_after_s": round(time.monotonic() - t0, 2)}

    def observe(self) -> Effect:
        """What the kill did as the system shows it. The whole node: no
        process of it runs and its port refuses connections (before
        ``_recover`` restarts it). One process: that process is gone."""
        running = self.node.is_running()
        port = connect_state(self.node.endpoint)
        evidence: dict[str, Any] = {
            "scope": self.scope, "node_running": running, "port": port,
            "endpoint": f"{self.node.endpoint.host}:{self.node.endpoint.port}"}
        if self.scope == "node":
            # Refused on loopback; a container's own address may time out or
            # be unreachable instead. Only an accepted connection is a node
            # that still serves.
            return Effect(not running and port != "accepted",
                          "the node's processes and a TCP connect to its port", evidence)
        victims = [m for m in self._members() if m.pid in self._victims]
        alive = [m.pid for m in victims if is_same(m)]
        evidence.update(killed=[m.pid for m in victims], still_alive=alive)
        return Effect(bool(victims) and not alive,
                      f"the killed {self.scope} process(es), by pid and start time", evidence)

    def _aftermath(self) -> dict[str, Any]:
        return self._orphans()

    def _orphans(self) -> dict[str, Any]:
        """Wait until ``orphan_bound_s`` after the kill for every recorded
        process of the node to be gone; record those still alive then (the
        orphans) and end them, each by its pid, so the restart can run."""
        members = self._members()
        start = self._killed_at if self._killed_at is not None else time.monotonic()
        wait_gone(members, max(0.0, start + self.orphan_bound_s - time.monotonic()))
        orphans = []
        for m in members:
            if is_same(m):
                orphans.append({"pid": m.pid, "names": proc_names(m.pid)[:80],
                                "alive_after_kill_s": round(time.monotonic() - start, 2)})
        ended = end_members([m for m in members if m.pid in {o["pid"] for o in orphans}])
        return {"scope": self.scope, "orphan_bound_s": self.orphan_bound_s, "orphans": orphans,
                "orphans_ended": ended, "processes_recorded": len(members)}

    def _recover(self) -> dict[str, Any]:
        if not self.restart:
            return {"restarted": False}
        if self.node.is_running():  # its leader outlived the kill and was ended just now
            wait_until(lambda: not self.node.is_running(), self.gone_within_s)
        if self.node.is_running():
            return {"restarted": False, "why": "the node still runs"}
        t0 = time.monotonic()
        self.node.start()
        try:
            self.node.wait_ready(self.ready_timeout_s)
        except NodeNotReady as e:
            # The restart failed: how long it was given and, where the node's
            # log said why (vLLM meeting a full device), its reason, for
            # restart_readiness to name.
            raise FaultError(f"restart failed: {e}", {
                "restarted": False, "restart_failed": {
                    "reason": e.reason, "after_s": round(time.monotonic() - t0, 2),
                    "ready_timeout_s": self.ready_timeout_s,
                    "state": "running" if self.node.is_running() else "exited"}}) from e
        done: dict[str, Any] = {"restarted": True, "pid": getattr(self.node, "pid", None),
                                "ready_after_s": round(time.monotonic() - t0, 2)}
        # Where the restart's time went, where the node can tell (a vLLM
        # replica reads its own log): restart_readiness reports it.
        phases = getattr(self.node, "startup_phases", None)
        if callable(phases):
            try:
                done["restart_phases"] = phases(time.time())
            except Exception as e:  # noqa: BLE001 - a missing breakdown never fails a heal
                done["restart_phases"] = {"error": f"{type(e).__name__}: {e}"}
        return done
