"""Heal from the ledger alone, with no live objects: after a crash, that is
all there is. Each kind knows how to undo its own inverse record."""

from __future__ import annotations

from .ledger import Ledger, LedgerEntry


def heal_entry(entry: LedgerEntry) -> str:
    if entry.kind == "process_kill":
        # The killed node belonged to a cluster that died with its harness;
        # there is nothing to restart. Its processes are ended by id at the
        # next suite start (fixtures.processes.reap_leftovers).
        return (f"closed {entry.kind} on {entry.target} from run {entry.run_id}: "
                "its cluster is gone, nothing to restart")
    return f"closed unknown fault kind {entry.kind!r} on {entry.target}: no healer known"


def heal_all(ledger: Ledger, skip_run: str | None = None) -> list[str]:
    lines = []
    for entry in ledger.pending():
        if isinstance(entry, str):
            lines.append(f"could not read: {entry} (left in place for inspection)")
            continue
        if entry.run_id == skip_run:
            continue
        lines.append(heal_entry(entry))
        ledger.remove(entry.id)
    return lines
