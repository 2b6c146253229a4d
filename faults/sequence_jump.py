"""lsn_jump on a stateful (sequence-batched) Triton model: steps of a
correlated sequence skip, repeat or restart in flight.

The SSE variant (faults/lsn_jump.py) rewrites token streams in the fault
proxy. Triton's sequences are request chains, not streams: the jump sits in
the Triton client (engines.triton.client.JumpControl), between the invoke
the history records and the request on the wire, so the history keeps what
the client meant and only the server's answers can show what arrived. This
fault writes the control file the client reads; the heal removes it. Modes
(the SSE names map onto them): ``skip`` (drop: the position after the
intended one), ``repeat`` (duplicate: the position before it again),
``restart`` (reorder: a second START for the live sequence). ``count`` steps
jump per window.

A correct server rejects every jumped step (``invariants.sequence`` counts
them as detected jumps); a server that accepts one continues with state the
client never built, which is that checker's violation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry

MODES = {"skip": "skip", "repeat": "repeat", "restart": "restart",
         "drop": "skip", "duplicate": "repeat", "reorder": "restart"}


def sent_path(jump_file: Path) -> Path:
    """Where the Triton client records the jumped steps it sent (engines.
    triton.client.JumpControl)."""
    return Path(jump_file).with_suffix(".sent")


class SequenceJump(Fault):
    # One kind, one registry entry: faults.catalogue maps "lsn_jump" to
    # LsnJump, whose undo hands ledger entries of this variant on to here.
    kind = "lsn_jump"
    needs_root = False
    privilege = "writes a control file in the run's own log directory"

    def __init__(self, target: str, run_id: str, ledger: Ledger, jump_file: Path,
                 mode: str = "skip", count: int = 3, **_sse_params: Any):
        if mode not in MODES:
            raise FaultError(f"lsn_jump (sequences): unknown mode {mode!r}; use one of "
                             f"{', '.join(MODES)}")
        if count < 1:
            raise FaultError(f"lsn_jump (sequences): count {count}: give 1 or more steps")
        super().__init__(target, run_id, ledger)
        self.jump_file = Path(jump_file)
        self.mode = MODES[mode]
        self.count = count

    def _preflight(self) -> None:
        if not self.jump_file.parent.is_dir():
            raise FaultError(f"lsn_jump (sequences): {self.jump_file.parent} does not exist; "
                             "is the cluster running?")

    def _inverse(self) -> dict[str, Any]:
        return {"jump_file": str(self.jump_file)}

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        tmp = self.jump_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": self.entry.id, "mode": self.mode,
                                   "count": self.count}))
        os.replace(tmp, self.jump_file)  # the client never reads half a file
        return {"variant": "sequence", "mode": self.mode, "count": self.count,
                "jump_file": str(self.jump_file)}

    def observe(self) -> Effect:
        """The jumped steps the Triton client put on the wire in this window
        (its record beside the control file, ``sent_path``): none means the
        jump did nothing (no sequence step passed while it was in)."""
        assert self.entry is not None
        try:
            d = json.loads(sent_path(self.jump_file).read_text())
        except (OSError, ValueError):
            d = {}
        sent = int(d.get("sent", 0)) if str(d.get("id")) == self.entry.id else 0
        return Effect(sent > 0, "jumped sequence steps the Triton client sent in this window",
                      {"sent": sent, "count": self.count, "mode": self.mode})

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        jump_file = Path(entry.inverse["jump_file"])
        jump_file.unlink(missing_ok=True)
        sent_path(jump_file).unlink(missing_ok=True)
        return {"variant": "sequence", "removed": str(jump_file)}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return f"{healed(entry)}: removed the sequence variant's control file {done['removed']}"
