"""The one background thread of every open History (ordeal/history/writer.py):
it seals a chunk that has waited its flush interval while nothing was
appended, and does the fsyncs, so an appender never waits on the disk."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the writer imports this module
    from .writer import History


class Sealer:
    """One daemon thread for every open History: seals a chunk that has
    waited ``flush_interval`` while nothing was appended, and does the
    fsyncs, so an appender (the workload's event loop) never waits on the
    disk. Holds the histories weakly: an unclosed, dropped History goes."""

    TICK_S = 0.1

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:  # also in a forked child: the parent's files are not its own
        self._histories: weakref.WeakSet[History] = weakref.WeakSet()
        self._wake = threading.Event()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, h: History) -> None:
        with self._guard:
            self._histories.add(h)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ordeal-history-sealer",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def discard(self, h: History) -> None:
        with self._guard:
            self._histories.discard(h)

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._guard:
                idle = not self._histories
            self._wake.wait(None if idle else self.TICK_S)
            self._wake.clear()
            self._tick_all()

    def _tick_all(self) -> None:  # its own frame: no History is held between ticks
        with self._guard:
            histories = list(self._histories)
        for h in histories:
            try:
                h._tick()
            except Exception:  # noqa: BLE001 - flush()/close() raise it to the owner
                pass

    def flush_all(self) -> None:
        """At exit: seal what an owner forgot to close (a crash skips this,
        and the reader copes: the unsealed tail)."""
        with self._guard:
            histories = list(self._histories)
        for h in histories:
            try:
                h.flush()
            except Exception:  # noqa: BLE001 - exiting; the tail stays readable unsealed
                pass


SEALER = Sealer()
atexit.register(SEALER.flush_all)
os.register_at_fork(after_in_child=SEALER._reset)
