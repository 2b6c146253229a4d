"""Checkers over a history. Pure: no sockets, no processes, no exceptions out."""

from .base import Checker, Result, RunContext, merge_valid, run_checker
from .no_silent_loss import NoSilentLoss
from .stream_wellformed import StreamWellFormed

DEFAULT_CHECKERS = (NoSilentLoss, StreamWellFormed)

__all__ = ["Checker", "Result", "RunContext", "merge_valid", "run_checker",
           "NoSilentLoss", "StreamWellFormed", "DEFAULT_CHECKERS"]
