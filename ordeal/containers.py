"""A thin adapter over the Docker engine, for what the Docker backend
(clusters/), the faults that reach containers and the cleanup need; it sits
here, below both, rather than in faults/ (issue 41).

Everything the suite creates in Docker carries labels: ``ordeal.cluster``
(the cluster id), ``ordeal.node`` (a container's node name), ``ordeal.owner``
(the harness, ``ordeal.ownership.Owner.label()``). So a crashed harness's
containers and networks are found by label and removed (``remove_leftovers``,
called by ``python -m faults heal-all`` and at every suite start), and nothing
without our label is ever touched.

Faults reach a container from the host: its processes by their host pids
(signals, SIGSTOP/SIGCONT), its network namespace with ``nsenter`` (iptables
run there from the host, so containers need no added capability).

The docker SDK is imported in ``docker_client`` only, not at the top: it is
optional (the ``docker`` extra), and without it there is simply no container
to find or remove.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .ownership import Owner

CLUSTER_LABEL = "ordeal.cluster"
NODE_LABEL = "ordeal.node"
OWNER_LABEL = "ordeal.owner"
IMAGE_LABEL = "ordeal.image"


class DockerUnavailable(RuntimeError):
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


def _kept(labels: dict[str, str], current_cluster: str | None) -> bool:
    """Not a leftover: the current cluster's, or its owner still runs."""
    owner = Owner.from_label(labels.get(OWNER_LABEL))
    return labels.get(CLUSTER_LABEL) == current_cluster or (owner is not None and owner.alive())


def _gone_meanwhile(e: Exception) -> bool:
    """The engine says another cleanup got there first: the object is gone
    (404) or its removal is already under way (409)."""
    status = getattr(e, "status_code", None)
    return status == 404 or (status == 409 and "in progress" in str(e))


def remove_leftovers(client: Any | None = None,
                     current_cluster: str | None = None) -> list[str]:
    """Remove containers and networks of clusters whose harness is gone.

    Only objects with our cluster label; a cluster whose harness still lives
    (another suite on this machine) is left alone, and so is
    ``current_cluster``. Returns one line per action. Without a Docker engine
    there is nothing to remove and the answer is empty. Safe beside another
    cleanup: what it removed first (404, or a removal in progress) is
    skipped without a word; the one whose removal succeeded reports it.
    """
    if client is None:
        try:
            client = docker_client()
        except DockerUnavailable:
            return []
    lines = []
    # ignore_removed: a container listed, then removed by another cleanup
    # before its details were fetched, is skipped, not a NotFound.
    for c in client.containers.list(all=True, filters={"label": CLUSTER_LABEL},
                                    ignore_removed=True):
        labels = c.labels or {}
        if _kept(labels, current_cluster):
            continue
        try:
            c.remove(force=True)
        except Exception as e:
            if _gone_meanwhile(e):
                continue
            raise
        lines.append(f"removed leftover container {c.name} of cluster "
                     f"{labels.get(CLUSTER_LABEL)}")
    for n in client.networks.list(filters={"label": CLUSTER_LABEL}):
        labels = n.attrs.get("Labels") or {}
        if _kept(labels, current_cluster):
            continue
        try:
            n.remove()
        except Exception as e:
            if _gone_meanwhile(e):
                continue
            raise
        lines.append(f"removed leftover network {n.name} of cluster {labels.get(CLUSTER_LABEL)}")
    return lines
