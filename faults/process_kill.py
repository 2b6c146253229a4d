"""process_kill: SIGKILL a node's whole process tree, optionally restart it.

The kill goes to the node's process group (the engine's API server, its
EngineCore and its workers together), as an OOM-killer or a crashed host
would leave it. There is nothing to undo (the processes are gone); a live
heal restarts the node and waits until it serves again (``_recover``), so
the heal's duration is the node's recovery time. After a crash the node's
cluster went with its harness and heal-all only closes the entry.
"""

from __future__ import annotations

import signal
import socket
import time
from typing import Any

from ordeal.procfs import group_members
from ordeal.topology import Endpoint, Node

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry


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


class ProcessKill(Fault):
    kind = "process_kill"
    needs_root = False
    privilege = (
        "sends SIGKILL to the node's own process group and restarts it; the harness "
        'started the node as its own user')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, restart: bool = True,
                 ready_timeout_s: float = 300.0, gone_within_s: float = 60.0):
        super().__init__(node.name, run_id, ledger)
        self.node = node
        self.restart = restart
        self.ready_timeout_s = ready_timeout_s
        # How long the killed tree may take to be gone, as the node's state
        # shows it: on a busy machine a container's exit can come well after
        # Docker's own 10 s wait for it.
        self.gone_within_s = gone_within_s

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Nothing: the killed processes are gone. (What a crashed harness
        left of the node's tree is ended by id by heal-all and at the next
        suite start: ordeal.ownership.reap_leftovers.)"""
        return {}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return f"{healed(entry, 'closed')}: its cluster is gone, nothing to restart"

    def _preflight(self) -> None:
        if not self.node.is_running():
            raise FaultError(f"process_kill: {self.node.name} is not running; nothing to kill "
                             "(heal it first, or pick a live node)")

    def _inverse(self) -> dict[str, Any]:
        return {"action": "restart" if self.restart else "none", "node": self.node.name}

    def _act(self) -> dict[str, Any]:
        """SIGKILL, then confirm from the node's state (its processes gone)
        within ``gone_within_s``; what the engine that carried the signal
        said is recorded, never taken as the verdict."""
        pid = getattr(self.node, "pid", None)
        t0 = time.monotonic()
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
        done: dict[str, Any] = {"signal": "SIGKILL", "pid": pid,
                                "gone_after_s": round(time.monotonic() - t0, 2)}
        if said:
            done["engine_said"] = said
        return done

    def observe(self) -> Effect:
        """The node is down as the system shows it: no process of it runs
        and its port refuses connections (before ``_recover`` restarts it)."""
        running = self.node.is_running()
        port = connect_state(self.node.endpoint)
        return Effect(not running and port == "refused",
                      "the node's processes and a TCP connect to its port",
                      {"node_running": running, "port": port,
                       "endpoint": f"{self.node.endpoint.host}:{self.node.endpoint.port}"})

    def _recover(self) -> dict[str, Any]:
        if not self.restart or self.node.is_running():
            return {"restarted": False}
        t0 = time.monotonic()
        self.node.start()
        self.node.wait_ready(self.ready_timeout_s)
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
