"""lsn_jump: a jump in the sequence of a token stream in flight, by the
proxy's L7 SSE toxics: ``mode`` drop (a gap), duplicate (a repeat) or
reorder (``count`` events reversed) of ``count`` data events after the first
``after_events``. The stream otherwise stays well framed, so only a client
or checker that follows the sequence (token ids against usage, greedy text
against its golden) can notice. On a Triton cluster the factory builds the
sequence variant instead (faults/sequence_jump.py: steps of a correlated
sequence skip, repeat or restart)."""

from __future__ import annotations

from typing import Any

from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Link

from .base import FaultError
from .ledger import Ledger, LedgerEntry
from .link_fault import LinkFault, ToxicSpec
from .sequence_jump import SequenceJump

MODES = {"drop": "sse_drop", "duplicate": "sse_duplicate", "reorder": "sse_reorder"}


class LsnJump(LinkFault):
    kind = "lsn_jump"
    traits = KindTraits(
        kind, acts_on="l7_link",
        endurance=EnduranceChoice("router-replica-0", {"mode": "duplicate", "after_events": 2},
                                  position=8),
        chaos_mesh_none=("HTTPChaos replaces or patches whole bodies; it cannot drop, repeat "
                         "or reorder single server-sent events inside a stream"))
    needs_root = False
    privilege = (
        "adds an SSE toxic through the fault proxy's control API on loopback; the proxy "
        'is a process the suite started')

    def __init__(self, link: Link, run_id: str, ledger: Ledger, mode: str = "drop",
                 after_events: int = 2, count: int | None = None, toxicity: float = 1.0):
        if mode not in MODES:
            raise FaultError(f"lsn_jump: unknown mode {mode!r}; use one of {', '.join(MODES)}")
        self.mode = mode
        count = count if count is not None else (2 if mode == "reorder" else 1)
        specs = [ToxicSpec(MODES[mode], "downstream",
                           {"after_events": after_events, "count": count}, toxicity)]
        super().__init__(link, run_id, ledger, specs)

    # Ledger entries of both variants are kind ``lsn_jump`` (one kind, one
    # registry entry); the sequence variant's inverse names its control file.

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        if "jump_file" in entry.inverse:
            return SequenceJump.undo(entry)
        return super().undo(entry)

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        if "jump_file" in entry.inverse:
            return SequenceJump.heal_line(entry, done)
        return super().heal_line(entry, done)
