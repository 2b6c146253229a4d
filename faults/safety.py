"""What the suite may touch: only loopback addresses (and the suite's own
namespaces and containers, and networks the user names with
``--allow-target``), only nodes that run. Checked before the ledger, the
system or the network is touched, so a refused fault or load changes
nothing. Host names other than ``localhost`` are refused: a name can
resolve anywhere."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterable, Iterator

from ordeal.topology import Endpoint, Node

from .base import FaultError

#: Addresses the suite may send traffic to or cut. Containers and network
#: namespaces the suite creates add their own subnets here at runtime.
ALLOWED_NETWORKS: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [
    ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


def allow_networks(cidrs: Iterable[str]) -> list[str]:
    """Add networks the user names as safe to break (``--allow-target``);
    returns them normalised. A bad CIDR is a ``FaultError`` saying so."""
    added = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError as e:
            raise FaultError(f"--allow-target {cidr!r}: not a network ({e}); give an address "
                             "or a CIDR such as 10.0.0.0/24") from None
        if net not in ALLOWED_NETWORKS:
            ALLOWED_NETWORKS.append(net)
        added.append(str(net))
    return added


@contextlib.contextmanager
def allowed(cidrs: Iterable[str]) -> Iterator[list[str]]:
    """``allow_networks`` for a block only (tests, one suite)."""
    before = list(ALLOWED_NETWORKS)
    try:
        yield allow_networks(cidrs)
    finally:
        ALLOWED_NETWORKS[:] = before


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
            "and the suite's own namespaces and containers. Ordeal only breaks what it started; "
            "if this address is yours to break, name its network with --allow-target CIDR.")


def require_running(node: Node, kind: str) -> None:
    if not node.is_running():
        raise FaultError(f"{kind}: node {node.name} is not running; start or heal it first, "
                         "or target a live node")
