"""Heal from the ledger alone, with no live objects: after a crash, that is
all there is. Each entry is undone by its kind's one inverse
(``Fault.undo``, the same code the live heal runs), newest first."""

from __future__ import annotations

from .catalogue import REGISTRY
from .ledger import Ledger, LedgerEntry


def heal_entry(entry: LedgerEntry) -> str:
    """Undo one entry; what was done, in one line."""
    cls = REGISTRY.get(entry.kind)
    if cls is None:
        return f"closed unknown fault kind {entry.kind!r} on {entry.target}: no healer known"
    return cls.heal_line(entry, cls.undo(entry))


def heal_all(ledger: Ledger, skip_run: str | None = None, force: bool = False) -> list[str]:
    """Heal every entry (except those of ``skip_run``, a live run's own, and,
    unless ``force``, those whose harness still runs: another pytest-xdist
    worker or suite on this machine, whose faults are not leftovers).
    An entry whose heal fails stays in the ledger and its line says why, so
    a second ``heal-all`` can retry; nothing is dropped silently.
    Newest injection first: a fault injected over another is undone before
    it, as monkeypatch undoes its changes."""
    lines = []
    for entry in reversed(ledger.pending()):
        if isinstance(entry, str):
            lines.append(f"could not read: {entry} (left in place for inspection)")
            continue
        if entry.run_id == skip_run:
            continue
        if not force and entry.owner.alive():
            lines.append(f"left {entry.kind} on {entry.target} ({entry.id}) alone: its harness, "
                         f"pid {entry.owner.pid}, still runs and will heal it (heal-all --force "
                         "heals it now)")
            continue
        try:
            lines.append(heal_entry(entry))
        except Exception as e:  # noqa: BLE001 - report, keep the entry, go on
            lines.append(f"FAILED to heal {entry.kind} on {entry.target} ({entry.id}): "
                         f"{type(e).__name__}: {e}; the entry stays in {ledger.dir}")
            continue
        ledger.remove(entry.id)
    return lines
