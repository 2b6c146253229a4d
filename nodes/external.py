"""A node of a deployment Ordeal did not start (``--cluster external``):
reached by its URL, never started, signalled or stopped by Ordeal.

It implements ordeal.topology's ``Node`` so that the monitor, the health
probe and the checkers read it like any other node. What only an owned
process can give is absent, and says so: ``pids()`` is empty (no RSS, no
cgroup), ``clock_file`` is None (no libfaketime), ``signal`` and ``start``
refuse (the user's hooks act instead: faults/hook.py), ``stop`` does
nothing (the deployment is not ours to stop). ``is_running`` is what can be
seen from here: its port accepts connections, or does not answer (a paused
process); a refused connection is "not running".
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from nodes.waits import http_get
from ordeal.topology import Endpoint, NodeNotReady, Role


class NotOwned(RuntimeError):
    """An action only an owned process allows, asked of an external node."""


class ExternalNode:
    """A router (the entrypoint) or a replica of the user's deployment."""

    pid = None  # no process of ours: monitor samples carry no pid
    container_id = None

    def __init__(self, name: str, role: Role, endpoint: Endpoint,
                 health_path: str = "/health", metrics_path: str = "/metrics",
                 ssl_context: Any = None):
        self.name = name
        # The target file's [tls] for https nodes (its CA, or no verification);
        # every health, metrics and version call of Ordeal's uses it.
        self.ssl_context = ssl_context
        self.role = role
        self.endpoint = endpoint
        self.health_url = endpoint.url + health_path
        self.metrics_url = endpoint.url + metrics_path
        self._fingerprint: str | None = None

    def is_running(self) -> bool:
        try:
            with socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=2.0):
                return True
        except TimeoutError:
            return True  # accepted by the kernel, or a paused process: still there
        except OSError:
            return False

    def signal(self, signum: int) -> str | None:
        raise NotOwned(f"{self.name} is a node of an external deployment: Ordeal sends it no "
                       "signal; give a hook for the fault kind in the target file")

    def pids(self) -> list[int]:
        return []

    @property
    def clock_file(self) -> Path | None:
        return None

    def start(self) -> None:
        raise NotOwned(f"{self.name} is a node of an external deployment: Ordeal does not "
                       "start it; a heal hook brings it back")

    def stop(self, grace: float = 10.0) -> None:
        """Nothing: the deployment is the user's, it stays up after the run."""

    def log_tail(self, lines: int = 20) -> list[str]:
        return []  # its logs are where the user keeps them

    def health(self, timeout: float = 2.0) -> int | None:
        """The health URL's status now; None when it does not answer."""
        try:
            status, _ = http_get(self.health_url, timeout=timeout, context=self.ssl_context)
            return status
        except OSError:
            return None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: int | None = None
        while time.monotonic() < deadline:
            last = self.health()
            if last == 200:
                return
            time.sleep(0.5)
        raise NodeNotReady(f"{self.name}: {self.health_url} did not answer 200 within "
                           f"{timeout:g}s (last: {last if last is not None else 'no answer'}); "
                           "check the deployment, or raise ready_timeout_s in the target file")

    def fingerprint(self) -> str:
        """vLLM's version from its /version (``vllm-<version>``), asked once;
        "external" when the node does not say (a gateway, a router)."""
        if self._fingerprint is None:
            try:
                status, body = http_get(self.endpoint.url + "/version", timeout=2.0,
                                        context=self.ssl_context)
                version = json.loads(body).get("version") if status == 200 else None
            except (OSError, ValueError, AttributeError):
                version = None
            if version is None:
                return "external"
            self._fingerprint = f"vllm-{version}" if self.role == "replica" else str(version)
        return self._fingerprint
