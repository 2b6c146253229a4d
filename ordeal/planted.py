"""Files through which the failure zoo (faults/zoo/) plants a shape inside
Ordeal's own vLLM replicas, where no signal or proxy toxic reaches: read by
``engines.vllm.node_header`` inside the replica, written and removed by the
shape's plant. Absent, they cost a replica two ``stat`` calls a second."""

from __future__ import annotations

from pathlib import Path

LEAK_SUFFIX = ".zoo-leak"
ERROR_SUFFIX = ".zoo-http-error"


def leak_path(log_dir: str | Path, node: str) -> Path:
    """While this file exists, the node's API server keeps the number of
    bytes it names for every request it serves, and never frees them (a
    memory leak); once it is gone, the next request frees them."""
    return Path(log_dir) / f"{node}{LEAK_SUFFIX}"


def read_leak(path: Path) -> int:
    """Bytes to keep per request: 0 when the file is absent or unreadable."""
    try:
        return max(0, int(path.read_text().strip() or 0))
    except (OSError, ValueError):
        return 0


def error_path(log_dir: str | Path, node: str) -> Path:
    """While this file exists, the node's API server answers every POST to
    ``/v1/`` itself with the server-error status the file names and an HTML
    page (what an overloaded or broken server in front of the engine sends),
    without running it, and journals each answer; /health and /metrics
    answer as before."""
    return Path(log_dir) / f"{node}{ERROR_SUFFIX}"


def read_error(path: Path) -> int:
    """The status to answer with: 0 when the file is absent, unreadable, or
    does not name a server error (500-599)."""
    try:
        status = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
    return status if 500 <= status <= 599 else 0
