"""What every part of the Ray backend shares: importing Ray for a driver
that talks to loopback only (``ray_module``), why the backend cannot run
here, the loopback check of every address Ray reports, the temp-dir root
and the label every process of a Ray cluster of ours carries."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ordeal.networks import SESSION_NETWORKS, NotOurs
from ordeal.topology import Endpoint

#: Every Ray temp dir the suite creates is /tmp/<RAY_TEMP_PREFIX><id>, with
#: a marker (RAY_OWNER_FILE: the owner's label, then the cluster id), so
#: heal-all removes only ours, and only when its harness is gone.
TEMP_ROOT = Path("/tmp")


#: The environment every process of a Ray cluster of ours carries.
BACKEND_LABEL = "ORDEAL_BACKEND"


NODE_UP = re.compile(r"^ORDEAL_RAY_NODE_UP address=(\S+) node_id=(\w+) ip=(\S+)$", re.M)


class RayError(RuntimeError):
    """The Ray cluster could not start, be joined, or place a replica; the
    message says what was wrong and what to do."""


def ray_module() -> Any:
    """Import Ray for a driver that talks to loopback only. Ray resolves
    127.0.0.1 to the machine's external address unless this variable is 0
    (read once, at import), so it is set first."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
        from ray._private import ray_constants
    except ImportError:
        raise RayError("Ray is not installed in this environment: "
                       ".venv/bin/python -m pip install 'ray[serve]==2.60.0' "
                       "(the `ray` extra)") from None
    ray_constants.ENABLE_RAY_CLUSTER = False  # also when Ray was imported earlier
    return ray


def unavailable_reason() -> str | None:
    """Why the ray backend cannot run here (for a skip that says so)."""
    try:
        ray_module()
    except RayError as e:
        return str(e)
    return None


def check_loopback(what: str, addresses: list[str | None]) -> None:
    """Every Ray address must be ours (loopback, or a network named with
    --allow-target); anything else is refused with what to do."""
    for addr in addresses:
        if not addr:
            continue
        host, _, port = addr.rpartition(":") if addr.count(":") == 1 else (addr, "", "0")
        try:
            SESSION_NETWORKS.require_ours(Endpoint(host, int(port or 0)), what)
        except NotOurs as e:
            raise RayError(f"{what}: address {addr} is not allowed: {e}") from None


def free_range(n: int) -> list[int]:
    """``n`` consecutive ports free now (Ray wants a worker port range)."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RayError(f"no {n} consecutive free ports for Ray workers in 20000-32000")
