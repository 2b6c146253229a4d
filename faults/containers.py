"""A thin adapter over the Docker engine, for what faults and cleanup need.

Everything the suite creates in Docker carries labels: ``ordeal.run`` (the
run id), ``ordeal.node`` (a container's node name), ``ordeal.owner`` (the
harness pid and its start time). So a crashed run's containers and networks
are found by label and removed (``remove_leftovers``, called by
``python -m faults heal-all`` and at every suite start), and nothing without
our label is ever touched.

Faults reach a container from the host: its processes by their host pids
(signals, SIGSTOP/SIGCONT), its network namespace with ``nsenter`` (iptables
run there from the host, so containers need no added capability).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ordeal.procfs import start_time

from .base import FaultError

RUN_LABEL = "ordeal.run"
NODE_LABEL = "ordeal.node"
OWNER_LABEL = "ordeal.owner"
IMAGE_LABEL = "ordeal.image"


class DockerUnavailable(FaultError):
    """No Docker SDK or no reachable engine; the message says what to do."""


def docker_client() -> Any:
    """A client for the local engine, or a clear error naming the fix."""
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        raise DockerUnavailable("the docker Python SDK is not installed: pip install -e "
                                "'.[docker]' (bash .ci/setup installs it)") from None
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:  # noqa: BLE001 - every way of failing means the same to the user
        raise DockerUnavailable(
            f"no Docker engine answers ({type(e).__name__}: {e}). Install and start one: "
            "apt-get install docker.io, then `dockerd &` as root (bash .ci/setup does both), "
            "or set DOCKER_HOST") from None
    return client


def owner_label() -> str:
    """This harness, as ``pid:start_time``: a label that outlives pid reuse."""
    return f"{os.getpid()}:{start_time(os.getpid())}"


def owner_alive(label: str | None) -> bool:
    if not label or ":" not in label:
        return False
    pid, _, start = label.partition(":")
    return pid.isdigit() and start_time(int(pid)) == start


def container_pid(container_id: str, client: Any | None = None) -> int | None:
    """The host pid of the container's first process (its init), or None
    when the container is gone or not running."""
    client = client or docker_client()
    try:
        state = client.api.inspect_container(container_id)["State"]
    except Exception:  # noqa: BLE001 - gone, or the engine forgot it: not running
        return None
    pid = int(state.get("Pid") or 0)
    return pid if state.get("Running") and pid > 0 else None


def container_members(container_id: str) -> list[int]:
    """Host pids of every process in the container, found by the container
    id in each process's cgroup (what ``docker top`` shows, without a call
    to the engine)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry.name}/cgroup").read_text()
        except OSError:
            continue
        if container_id in text:
            out.append(int(entry.name))
    return sorted(out)


def remove_leftovers(client: Any | None = None, current_run: str | None = None) -> list[str]:
    """Remove containers and networks of runs whose harness is gone.

    Only objects with our run label; a run whose harness still lives
    (another suite on this machine) is left alone, and so is ``current_run``.
    Returns one line per action. Without a Docker engine there is nothing
    to remove and the answer is empty.
    """
    if client is None:
        try:
            client = docker_client()
        except DockerUnavailable:
            return []
    lines = []
    for c in client.containers.list(all=True, filters={"label": RUN_LABEL}):
        labels = c.labels or {}
        if labels.get(RUN_LABEL) == current_run or owner_alive(labels.get(OWNER_LABEL)):
            continue
        c.remove(force=True)
        lines.append(f"removed leftover container {c.name} of run {labels.get(RUN_LABEL)}")
    for n in client.networks.list(filters={"label": RUN_LABEL}):
        labels = n.attrs.get("Labels") or {}
        if labels.get(RUN_LABEL) == current_run or owner_alive(labels.get(OWNER_LABEL)):
            continue
        n.remove()
        lines.append(f"removed leftover network {n.name} of run {labels.get(RUN_LABEL)}")
    return lines
