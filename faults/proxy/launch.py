"""Start the fault proxy as a child process and wait for its READY line.

For tests, benchmarks and tools; a cluster backend may start it as a
labelled ManagedProcess instead (same argv: ``proxy_argv``). The child runs
in a session of its own and is only ever signalled by its own pid.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from ordeal.topology import Endpoint

from .server import READY_PREFIX, parse_ready_line

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def proxy_argv(links: Sequence[str], control: str = "127.0.0.1:0", seed: int = 0,
               python: str = sys.executable) -> list[str]:
    """``links`` as NAME=LISTENPORT:UPSTREAMHOST:UPSTREAMPORT."""
    argv = [python, "-m", "faults.proxy", "--control", control, "--seed", str(seed)]
    for link in links:
        argv += ["--link", link]
    return argv


class ProxyProcess:
    def __init__(self, links: Sequence[str], control: str = "127.0.0.1:0", seed: int = 0,
                 stderr_path: Path | None = None, env: Mapping[str, str] | None = None):
        self.argv = proxy_argv(links, control, seed)
        self.stderr_path = stderr_path
        self.env = dict(env if env is not None else os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PACKAGE_ROOT), self.env.get("PYTHONPATH")]))
        self.proc: subprocess.Popen[bytes] | None = None
        self.control: Endpoint | None = None
        self.listens: dict[str, Endpoint] = {}

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30.0) -> "ProxyProcess":
        err = open(self.stderr_path, "ab") if self.stderr_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        finally:
            if self.stderr_path:
                err.close()  # type: ignore[union-attr]
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith(READY_PREFIX.encode()) or not line:
                    break
            elif self.proc.poll() is not None:
                break
        text = line.decode(errors="replace").strip()
        if not text.startswith(READY_PREFIX):
            code = self.proc.poll()
            self.stop()
            raise RuntimeError(
                f"fault proxy did not print its READY line within {timeout}s "
                f"(exit code {code}); argv: {' '.join(self.argv)}; "
                f"see {self.stderr_path or 'its stderr (pass stderr_path to keep it)'}")
        (chost, cport), links = parse_ready_line(text)
        self.control = Endpoint(chost, cport)
        self.listens = {name: Endpoint(h, p) for name, (h, p) in links.items()}
        return self

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace``; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> "ProxyProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
