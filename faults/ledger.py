"""The fault ledger: what is broken right now, on disk, before it is broken.

Every fault writes an entry *before* it acts and removes it *after* it heals,
so after a crash the ledger lists exactly the faults that may still be in
effect. Entries are one JSON file each (atomic rename, fsync), so a crash
mid-write leaves either the old state or the new one, never half of one.
Entries come back in the order of injection (``seq``), so that heal-all can
undo them newest first, as monkeypatch undoes its changes.

Cleanups can run at once (two pytest-xdist workers' session start, a
``python -m faults heal-all`` beside a starting suite): heal-all holds the
ledger's heal lock (``healing``) for its whole pass, so one pass after the
other keeps newest-first, and claims each entry (``claim``: an atomic rename,
``ordeal.ownership.Claimer``) before it runs the undo, so an entry is healed
and reported once. A vanished or claimed entry is someone else's; a claim
whose heal-all died is taken over by the next; an entry whose heal failed
goes back (``give_back``) for a later heal-all.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ordeal import ownership
from ordeal.config import state_dir
from ordeal.history.ops import utc_iso
from ordeal.ownership import Claimer, Owner


def default_ledger_dir() -> Path:
    return state_dir() / "ledger"


_seq_lock = threading.Lock()
_last_seq = 0


def next_seq() -> int:
    """Injection order: the wall clock in ns, made strictly increasing in
    this process (two faults injected within one clock tick, or across a
    clock stepped back, keep their order)."""
    global _last_seq
    with _seq_lock:
        _last_seq = max(time.time_ns(), _last_seq + 1)
        return _last_seq


@dataclass
class LedgerEntry:
    kind: str
    target: str
    run_id: str
    inverse: dict[str, Any]  # what heal must do, readable without the live objects
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    injected: str = field(default_factory=utc_iso)
    # Injection order (next_seq); 0 in entries written before it was kept.
    seq: int = field(default_factory=next_seq)
    # The harness that injected it: while it runs (``owner.alive()``), the
    # fault is its own to heal, not a leftover.
    owner: Owner = field(default_factory=Owner.current)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        """An entry as ``Ledger.record`` wrote it; TypeError for anything else.
        Entries of a crashed harness of the previous format (``owner_pid`` and
        ``owner_start`` instead of ``owner``) still load, so heal-all heals
        them after an upgrade."""
        if isinstance(data, dict) and "owner" not in data and "owner_pid" in data:
            data = {k: v for k, v in data.items() if k not in ("owner_pid", "owner_start")} | {
                "owner": {"pid": data["owner_pid"], "start_time": data.get("owner_start")}}
        owner = data.get("owner") if isinstance(data, dict) else None
        if not isinstance(owner, dict):
            raise TypeError(f"not an entry with an owner {{pid, start_time}}: {str(data)[:200]}")
        return cls(**{"seq": 0, **data, "owner": Owner(**owner)})


def untrusted(path: Path) -> str | None:
    """Why the ledger file ``path`` may not have its commands run (a hook
    entry's heal is a shell command), or None: the file and its directory
    must be owned by the user running this and writable by no one else;
    anyone who can write either could make heal-all run what they like."""
    for what, p in (("file", path), ("directory", path.parent)):
        try:
            st = os.stat(p)
        except OSError as e:
            return f"cannot stat its {what} {p} ({e})"
        if st.st_uid != os.geteuid():
            return (f"its {what} {p} is owned by uid {st.st_uid}, not by you (uid "
                    f"{os.geteuid()})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (f"its {what} {p} is writable by its group or by others (mode "
                    f"{stat.filemode(st.st_mode)})")
    return None


def _make_private(directory: Path) -> None:
    """A ledger directory of ours that an older Ordeal made under a umask of
    002 (group-writable) is made this user's alone, so heal-all does not
    refuse the heals written into it from now on (``untrusted``). One that
    is another user's is left as it is (and refused)."""
    try:
        st = os.stat(directory)
        if st.st_uid == os.geteuid() and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.chmod(directory, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        pass


class Ledger:
    def __init__(self, directory: Path | None = None):
        self.dir = Path(directory) if directory else default_ledger_dir()

    def record(self, entry: LedgerEntry) -> LedgerEntry:
        """Write ``entry`` whole or not at all. A new ledger directory is
        this user's alone (0700) and each entry file too (0600): heal-all
        runs a hook entry's heal only from such files (``untrusted``)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _make_private(self.dir)
        final = self.dir / f"{entry.id}.json"
        tmp = self.dir / f".{entry.id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(entry), f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        return entry

    def path(self, entry_id: str) -> Path:
        return self.dir / f"{entry_id}.json"

    def remove(self, entry_id: str) -> None:
        """The owner's heal is done: its entry goes (a no-op when a forced
        heal-all holds it: that one closes its claim)."""
        self.path(entry_id).unlink(missing_ok=True)

    @contextmanager
    def healing(self, timeout_s: float = 600.0) -> Iterator[None]:
        """Hold the ledger's heal lock: one heal-all pass at a time, so
        concurrent ones still undo newest first. ``ordeal.ownership.Busy``
        when another holds it longer than ``timeout_s``."""
        with ownership.exclusive(self.dir / ".heal.lock", timeout_s):
            yield

    def claim(self, entry_id: str, claimer: Claimer) -> tuple[Path, LedgerEntry] | None:
        """Take the entry for healing: its file, or a claim on it whose
        claimer is gone, renamed to ``claimer``'s claim name. Returns the
        claim and the entry as it stands now; None when it is someone
        else's (healed, or being healed, by another)."""
        mine = claimer.claim(self.path(entry_id))
        if mine is None:
            for claim, original in ownership.left_claims(self.dir):
                if original.name == self.path(entry_id).name:
                    mine = claimer.take_over(claim)
                    if mine is not None:
                        break
        if mine is None:
            return None
        try:
            return mine, LedgerEntry.from_dict(json.loads(mine.read_text()))
        except (OSError, ValueError, TypeError):
            ownership.give_back(mine, self.path(entry_id))  # pending() reports it unreadable
            return None

    def close(self, claim: Path) -> None:
        """A claimed entry was healed: it goes."""
        claim.unlink(missing_ok=True)

    def give_back(self, claim: Path, entry_id: str) -> None:
        """A claimed entry could not be healed: it goes back, open, for a
        later heal-all."""
        ownership.give_back(claim, self.path(entry_id))

    def pending(self) -> list[LedgerEntry | str]:
        """Entries still open (claimed ones too, until healed), oldest
        injection first; an unreadable file comes back, after them, as its
        error text (reported, never silently skipped)."""
        if not self.dir.is_dir():
            return []
        entries: dict[str, LedgerEntry] = {}
        unreadable: list[str] = []
        for path in sorted(self.dir.iterdir()):
            claimed = ownership.parse_claim(path)
            name = claimed[0].name if claimed is not None else path.name
            if not name.endswith(".json") or (claimed is None and name.startswith(".")):
                continue
            try:
                entry = LedgerEntry.from_dict(json.loads(path.read_text()))
            except FileNotFoundError:
                continue  # healed, or claimed, meanwhile
            except (OSError, ValueError, TypeError) as e:
                unreadable.append(f"{path}: unreadable ledger entry ({e})")
                continue
            entries.setdefault(entry.id, entry)
        return [*sorted(entries.values(), key=lambda e: (e.seq, e.injected)), *unreadable]
