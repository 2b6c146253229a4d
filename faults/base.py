"""The Fault protocol: inject, heal, and a context manager that always heals.

As in pytest's monkeypatch, a fault records how to undo itself *before* it
acts (the ledger entry), and heal undoes it; heal is idempotent and safe to
call after a crash or twice. ``with fault:`` heals in ``finally`` and never
swallows the exception that ended the block.

Faults touch the cluster only through ordeal.topology (Node.signal,
Node.start, ...), never through a backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .ledger import Ledger, LedgerEntry

REGISTRY: dict[str, type["Fault"]] = {}


class Fault(ABC):
    kind: ClassVar[str]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if getattr(cls, "kind", None):
            REGISTRY[cls.kind] = cls

    def __init__(self, target: str, run_id: str, ledger: Ledger):
        self.target = target
        self.run_id = run_id
        self.ledger = ledger
        self.entry: LedgerEntry | None = None

    @abstractmethod
    def _inverse(self) -> dict[str, Any]:
        """How to heal, as plain data for the ledger."""

    @abstractmethod
    def _act(self) -> dict[str, Any]:
        """Break the thing. Returns what was done, for the history."""

    @abstractmethod
    def _undo(self) -> dict[str, Any]:
        """Repair the thing. Must be safe when already repaired."""

    @property
    def active(self) -> bool:
        return self.entry is not None

    def inject(self) -> dict[str, Any]:
        if self.entry is not None:
            raise RuntimeError(f"{self.kind} on {self.target} is already injected")
        self.entry = self.ledger.record(
            LedgerEntry(self.kind, self.target, self.run_id, self._inverse()))
        return {"kind": self.kind, "target": self.target, "fault_id": self.entry.id,
                **self._act()}

    def heal(self) -> dict[str, Any]:
        if self.entry is None:
            return {"kind": self.kind, "target": self.target, "already_healed": True}
        done = self._undo()
        fault_id = self.entry.id
        self.ledger.remove(fault_id)
        self.entry = None
        return {"kind": self.kind, "target": self.target, "fault_id": fault_id, **done}

    def __enter__(self) -> "Fault":
        self.inject()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()
