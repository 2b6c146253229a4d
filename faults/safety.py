"""What the suite may touch: only loopback addresses (and the suite's own
namespaces and containers, and networks the user names with
``--allow-target``: ``ordeal.networks.SESSION_NETWORKS``), only nodes that
run. Checked before the ledger, the system or the network is touched, so a
refused fault or load changes nothing. Host names other than ``localhost``
are refused: a name can resolve anywhere."""

from __future__ import annotations

from ordeal.networks import SESSION_NETWORKS, NotOurs
from ordeal.topology import Endpoint, Node

from .base import FaultError


def require_ours(endpoint: Endpoint, kind: str) -> None:
    """``FaultError`` unless the session may touch ``endpoint``."""
    try:
        SESSION_NETWORKS.require_ours(endpoint, kind)
    except NotOurs as e:
        raise FaultError(str(e)) from None


def down_detail(node: Node, lines: int = 5) -> str:
    """Why a node is down, as far as it can tell: its exit status and its
    last log lines (for the error that names it)."""
    parts = []
    exit_code = getattr(node, "exit_code", None)
    if callable(exit_code) and exit_code() is not None:
        parts.append(f"its process exited with code {exit_code()}")
    try:
        tail = [line.strip()[:200] for line in node.log_tail(lines) if line.strip()]
    except Exception:  # noqa: BLE001 - only a detail of an error already on its way
        tail = []
    if tail:
        parts.append("its last log lines: " + " | ".join(tail))
    return f" ({'; '.join(parts)})" if parts else ""


def require_running(node: Node, kind: str) -> None:
    if not node.is_running():
        raise FaultError(f"{kind}: node {node.name} is not running{down_detail(node)}; start "
                         "or heal it first, or target a live node")
