"""The served journal: each replica's own record of the requests it served.

Written inside each vLLM replica by ``engines.vllm.node_header`` (one JSON
line per event, one ``os.write`` each), read by the monitor into the history
(``monitor``/``served`` ops), judged by ``no_duplicate_execution`` and
``health_truthful``. Lines: ``{"phase": "begin", "rid": ...}`` when a request
with an ``x-request-id`` arrives, and ``{"rid", "status", "complete"}`` when
its response ends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JOURNAL_SUFFIX = ".served.jsonl"


def journal_path(log_dir: str | Path, node: str) -> Path:
    """Where a node's served journal lives: beside its log."""
    return Path(log_dir) / f"{node}{JOURNAL_SUFFIX}"


class JournalTail:
    """Reads the lines a replica appended to its served journal since the
    last read (engines.vllm.node_header). Starts at the journal's current end, so
    a run sees only its own requests. A line cut mid-write waits for the next
    read; a line that is not JSON is reported, never dropped silently."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def read_new(self) -> tuple[list[list[Any]], list[str], list[str]]:
        """(ended requests as [rid, status, complete], request ids that began,
        problems). A line without a phase is an end line (older journals)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(16 << 20)
        except OSError:
            return [], [], []  # no journal yet: nothing served with an id
        end = data.rfind(b"\n") + 1
        self.offset += end
        entries: list[list[Any]] = []
        begun: list[str] = []
        bad: list[str] = []
        for line in data[:end].splitlines():
            try:
                d = json.loads(line)
                if d.get("phase") == "begin":
                    begun.append(str(d["rid"]))
                else:
                    entries.append([d["rid"], d["status"], d["complete"]])
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                bad.append(f"{self.path}: bad journal line {line[:120]!r} ({e})")
        return entries, begun, bad
