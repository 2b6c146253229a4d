"""Files through which the failure zoo (faults/zoo/) plants a shape inside
Ordeal's own vLLM replicas, where no signal or proxy toxic reaches: read by
``engines.vllm.node_header`` inside the replica, written and removed by the
shape's plant. Absent, they cost a replica one ``stat`` a second."""

from __future__ import annotations

from pathlib import Path

LEAK_SUFFIX = ".zoo-leak"


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
