"""The suite's own cgroup v2 directories: made, joined, found and removed.

Why cgroups: the simulated Ray nodes all share 127.0.0.1, so an address
cannot tell one node's packets from another's. A cgroup can: iptables'
``-m cgroup --path`` matches the cgroup of the socket that sends a packet
(OUTPUT hook), so a node that runs in a cgroup of its own can be cut off by
rules that name it (``faults/ray_node.py``, ``ray_node_partition``).

Only directories named ``ordeal-*`` directly under the cgroup v2 root are
ever made or removed; nothing else of the hierarchy is touched. Linux only;
no external tools.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PREFIX = "ordeal-"


def mount_point(mounts: str | None = None) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on a
    unified host, ``/sys/fs/cgroup/unified`` on a hybrid one), or None."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def unavailable_reason() -> str | None:
    """Why the suite cannot make cgroups here, or None when it can."""
    root = mount_point()
    if root is None:
        return "no cgroup v2 hierarchy is mounted (no 'cgroup2' line in /proc/self/mounts)"
    if not os.access(root, os.W_OK):
        return (f"the cgroup v2 root {root} is not writable by uid {os.geteuid()}: making a "
                "cgroup needs root")
    return None


def check_name(rel: str) -> str:
    """``rel`` is a path under the root whose first part is ours
    (``ordeal-*``); returned with one leading slash, as iptables takes it."""
    parts = [p for p in rel.split("/") if p]
    if not parts or not parts[0].startswith(PREFIX) or any(p in (".", "..") for p in parts):
        raise ValueError(f"cgroup {rel!r}: the suite makes and removes only /{PREFIX}* "
                         "cgroups directly under the cgroup v2 root")
    return "/" + "/".join(parts)


def make(rel: str) -> Path:
    """Create ``rel`` (and its parents) under the cgroup v2 root."""
    root = mount_point()
    reason = unavailable_reason()
    if root is None or reason is not None:
        raise OSError(reason or "no cgroup v2 hierarchy")
    path = root / check_name(rel).lstrip("/")
    path.mkdir(parents=True, exist_ok=True)
    return path


def join(path: Path, pid: int | None = None) -> None:
    """Move ``pid`` (default: this process) into the cgroup at ``path``;
    children forked afterwards are born there."""
    (Path(path) / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")


def procs(path: Path) -> list[int]:
    """Pids in the cgroup at ``path`` and below; [] when it is gone."""
    out: list[int] = []
    for f in sorted(Path(path).rglob("cgroup.procs")):
        try:
            out += [int(x) for x in f.read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def kill_all(rel: str) -> list[int]:
    """SIGKILL every process in the suite's cgroup ``rel`` and below, by
    pid; returns them. Only for a cgroup the caller knows to be its own:
    what runs there was born there, from a process the suite started (a
    vLLM EngineCore whose API server Ray killed outlives it there, and
    nothing else would find it)."""
    root = mount_point()
    if root is None:
        return []
    top = root / check_name(rel).lstrip("/")
    killed = []
    for pid in procs(top):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def remove(rel: str, wait_s: float = 5.0) -> list[str]:
    """Remove ``rel`` and its children, deepest first. A cgroup still holding
    a process cannot be removed (the kernel says EBUSY): it is retried for
    ``wait_s`` (processes that were just killed leave a moment later), then
    named in the returned problems; nothing is killed here."""
    name = check_name(rel)
    root = mount_point()
    if root is None:
        return []
    top = root / name.lstrip("/")
    if not top.is_dir():
        return []
    deadline = time.monotonic() + wait_s
    while True:
        problems = []
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()),
                      key=lambda d: len(d.parts), reverse=True) + [top]
        for d in dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                problems.append(f"cgroup {d} not removed ({e.strerror}); pids in it: "
                                f"{procs(d)[:10]}")
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.2)


def ours(root: Path | None = None) -> list[str]:
    """Every ``/ordeal-*`` cgroup directly under the root."""
    root = root or mount_point()
    if root is None or not root.is_dir():
        return []
    return sorted("/" + d.name for d in root.glob(f"{PREFIX}*") if d.is_dir())
