"""The fault ledger: what is broken right now, on disk, before it is broken.

Every fault writes an entry *before* it acts and removes it *after* it heals,
so after a crash the ledger lists exactly the faults that may still be in
effect. Entries are one JSON file each (atomic rename, fsync), so a crash
mid-write leaves either the old state or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ordeal.config import state_dir
from ordeal.history import utc_iso
from ordeal.procfs import start_time


def default_ledger_dir() -> Path:
    return state_dir() / "ledger"


@dataclass
class LedgerEntry:
    kind: str
    target: str
    run_id: str
    inverse: dict[str, Any]  # what heal must do, readable without the live objects
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    injected: str = field(default_factory=utc_iso)
    owner_pid: int = field(default_factory=os.getpid)
    # The owner's start time (with its pid: that very process, not a later
    # one with a reused pid). None in entries written before it was kept.
    owner_start: str | None = field(default_factory=lambda: start_time(os.getpid()))

    def owner_alive(self) -> bool:
        """The harness that injected this still runs (another one than us):
        its faults are its own to heal, not a leftover."""
        return (self.owner_pid != os.getpid() and self.owner_start is not None
                and start_time(self.owner_pid) == self.owner_start)


class Ledger:
    def __init__(self, directory: Path | None = None):
        self.dir = Path(directory) if directory else default_ledger_dir()

    def record(self, entry: LedgerEntry) -> LedgerEntry:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"{entry.id}.json"
        tmp = self.dir / f".{entry.id}.tmp"
        with tmp.open("w") as f:
            json.dump(asdict(entry), f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        return entry

    def remove(self, entry_id: str) -> None:
        (self.dir / f"{entry_id}.json").unlink(missing_ok=True)

    def pending(self) -> list[LedgerEntry | str]:
        """Entries still open; an unreadable file comes back as its error
        text (reported, never silently skipped)."""
        if not self.dir.is_dir():
            return []
        out: list[LedgerEntry | str] = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                out.append(LedgerEntry(**json.loads(path.read_text())))
            except (ValueError, TypeError) as e:
                out.append(f"{path}: unreadable ledger entry ({e})")
        return out
