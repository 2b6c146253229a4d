"""What a fault may touch: only loopback addresses (and, later, the suite's
own namespaces and containers), only nodes that run. Checked before the
ledger or the system is touched, so a refused fault changes nothing."""

from __future__ import annotations

import ipaddress

from ordeal.topology import Endpoint, Node

from .base import FaultError

#: Addresses the suite may send traffic to or cut. Containers and network
#: namespaces the suite creates add their own subnets here at runtime.
ALLOWED_NETWORKS: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [
    ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


def require_ours(endpoint: Endpoint, kind: str) -> None:
    host = "127.0.0.1" if endpoint.host == "localhost" else endpoint.host
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise FaultError(f"{kind}: {endpoint.host!r} is not an IP address; faults act only on "
                         "loopback and on networks the suite created") from None
    if not any(addr in net for net in ALLOWED_NETWORKS):
        raise FaultError(
            f"{kind}: refusing to touch {endpoint.host}:{endpoint.port}: it is outside loopback "
            "and the suite's own namespaces and containers. Ordeal only breaks what it started.")


def require_running(node: Node, kind: str) -> None:
    if not node.is_running():
        raise FaultError(f"{kind}: node {node.name} is not running; start or heal it first, "
                         "or target a live node")
