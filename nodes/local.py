"""A node of the cluster that is a process (group) on this machine.

``LocalNode`` implements ordeal.topology's ``Node`` on top of a
``ManagedProcess``: every engine's local node (a vLLM replica, its router, a
Triton server, HAProxy) is one, so faults reach them all the same way.
"""

from __future__ import annotations

from pathlib import Path

from nodes.process import ManagedProcess, group_members
from nodes.waits import wait_http_ok
from ordeal.topology import Endpoint, Role


class LocalNode:
    """A Node (ordeal.topology) backed by a ManagedProcess on this machine."""

    role: Role

    def __init__(self, name: str, role: Role, endpoint: Endpoint, process: ManagedProcess,
                 hint: str):
        self.name = name
        self.role = role
        self.endpoint = endpoint
        self.process = process
        self.hint = hint
        self._fingerprint: str | None = None
        self._clock_file: Path | None = None  # set by backends that start under libfaketime

    def is_running(self) -> bool:
        return self.process.is_running()

    def exit_code(self) -> int | None:
        """The process's exit status once it ended (negative: the signal), else None."""
        return self.process.exit_code()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def signal(self, signum: int) -> str | None:
        self.process.signal(signum)
        return None

    def pids(self) -> list[int]:
        return group_members(self.process.pid) if self.process.is_running() else []

    @property
    def clock_file(self) -> Path | None:
        return self._clock_file

    def start(self) -> None:
        self.process.start()

    def stop(self, grace: float = 10.0) -> None:
        self.process.stop(grace)

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.process.log_tail(lines)

    def wait_ready(self, timeout: float) -> None:
        wait_http_ok(
            name=self.name, url=f"{self.endpoint.url}/health", timeout=timeout,
            is_running=self.process.is_running, exit_code=self.process.exit_code,
            log_tail=self.process.log_tail, hint=self.hint, reason=self.failure_reason)

    def failure_reason(self, tail: list[str]) -> str | None:
        """Why the node's own software says it failed to start, from its log
        tail; an engine's node overrides it (a vLLM replica: out of memory).
        None: no line says."""
        return None

    def fingerprint(self) -> str:
        return self._fingerprint or "unknown"
