"""Faults: make things go wrong, record it first, always heal."""

from .base import Fault, FaultError
from .ledger import Ledger, LedgerEntry
from .process_kill import ProcessKill

__all__ = ["Fault", "FaultError", "Ledger", "LedgerEntry", "ProcessKill"]
