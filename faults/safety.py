"""What the suite may touch: only loopback addresses (and the suite's own
namespaces and containers, and networks the user names with
``--allow-target``: ``ordeal.ownership.SESSION_NETWORKS``), only nodes that
run. Checked before the ledger, the system or the network is touched, so a
refused fault or load changes nothing. Host names other than ``localhost``
are refused: a name can resolve anywhere."""

from __future__ import annotations

from ordeal.ownership import SESSION_NETWORKS, NotOurs
from ordeal.topology import Endpoint, Node

from .base import FaultError


def require_ours(endpoint: Endpoint, kind: str) -> None:
    """``FaultError`` unless the session may touch ``endpoint``."""
    try:
        SESSION_NETWORKS.require_ours(endpoint, kind)
    except NotOurs as e:
        raise FaultError(str(e)) from None


def require_running(node: Node, kind: str) -> None:
    if not node.is_running():
        raise FaultError(f"{kind}: node {node.name} is not running; start or heal it first, "
                         "or target a live node")
