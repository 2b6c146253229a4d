"""Faults: make things go wrong, record it first, always heal."""

from .base import REGISTRY, Fault, FaultError
from .ledger import Ledger, LedgerEntry
from .process_kill import ProcessKill

__all__ = ["REGISTRY", "Fault", "FaultError", "Ledger", "LedgerEntry", "ProcessKill"]
