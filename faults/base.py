"""The Fault protocol: inject, heal, and a context manager that always heals.

As in pytest's monkeypatch, a fault records how to undo itself *before* it
acts (the ledger entry's ``inverse``), and heal undoes it; heal is idempotent
and safe to call after a crash or twice. ``with fault:`` heals in ``finally``
and never swallows the exception that ended the block.

Each kind has ONE inverse, the classmethod ``undo(entry)``: it reads nothing
but the ledger entry, so the live heal (``Fault.heal``) and the crash heal
(``python -m faults heal-all``, faults/heal_all.py) run the very same code.
What only a live run can do after that (restart a killed node and wait until
it serves: the cluster of a crashed harness is gone with it) is ``_recover``.
A kind's class declares ``traits`` (ordeal.kinds.KindTraits: where it acts,
whether it stops its target, its Chaos Mesh standing, its endurance choice);
defining the class registers it, and faults/catalogue.py imports every
kind's module. Nothing else lists kinds.

Faults touch the cluster only through ordeal.topology (Node.signal,
Node.start, ...), never through a backend.
"""

from __future__ import annotations

import os
import pwd
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ordeal import kinds
from ordeal.kinds import KindTraits

from .ledger import Ledger, LedgerEntry

#: Every registered kind's class, by name (filled as the classes are
#: defined; faults.catalogue imports them all and is the one to ask).
CLASSES: dict[str, type["Fault"]] = {}


class FaultError(RuntimeError):
    """A fault that cannot be injected as asked (dead node, unknown target,
    an address the suite does not own, a missing tool). Raised *before*
    anything changed; the message says what was wrong and what to do.

    ``record`` is what was done before it failed (a hook's command, exit
    code, output and the processes ended): the nemesis puts it in the
    fault's window and history, so a failed inject or heal keeps its
    evidence, not only its message."""

    def __init__(self, message: str, record: dict[str, Any] | None = None):
        super().__init__(message)
        self.record: dict[str, Any] = dict(record or {})


class PrivilegeError(FaultError):
    """A fault that needs root, asked of a harness that is not root. Raised
    before the ledger or the system is touched."""


@dataclass(frozen=True)
class Effect:
    """What a fault's observation found in the system's state while the
    fault was still in: whether it acted (``effective``), the figures that
    say so, and what was looked at. A chaos run whose fault did nothing has
    proven nothing; invariants.fault_effective judges these."""

    effective: bool | None  # None: the observation read nothing (no evidence either way)
    how: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"effective": self.effective, "how": self.how, "evidence": self.evidence}


def is_root() -> bool:
    return os.geteuid() == 0


def user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def healed(entry: LedgerEntry, verb: str = "healed") -> str:
    """The start of a heal-all line: ``healed KIND on TARGET from run RUN``."""
    return f"{verb} {entry.kind} on {entry.target} from run {entry.run_id}"


class Fault(ABC):
    kind: ClassVar[str]
    #: Least privilege: whether injecting this kind needs root, and why (or
    #: why not). Listed by ``python -m faults catalogue``. A fault whose need
    #: depends on how it acts (gpu_throttle: a cgroup quota on a CPU machine,
    #: a CUDA co-tenant on a GPU) says so in ``root_reason``.
    needs_root: ClassVar[bool] = False
    privilege: ClassVar[str] = ""
    #: What a user who cannot be root can use instead (for the refusal).
    without_root: ClassVar[str] = ""
    #: Capabilities root itself must hold (a container's root may lack them).
    capabilities: ClassVar[tuple[str, ...]] = ()
    #: Programs this kind runs, which must be on PATH (a GPU machine's image
    #: may have no iptables): a kind without one is left out at start.
    tools: ClassVar[tuple[str, ...]] = ()
    #: What the rest of Ordeal knows of this kind (ordeal.kinds). Declared
    #: in the class's own body, it registers the class as the kind's; a
    #: variant that another class registers (Triton's sequence jump, a
    #: hook) declares none.
    traits: ClassVar[KindTraits | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        own = cls.__dict__.get("traits")
        if own is None:
            return
        if own.kind != cls.kind:
            raise TypeError(f"{cls.__name__}: traits name {own.kind!r} and the class's kind is "
                            f"{cls.kind!r}")
        old = CLASSES.get(cls.kind)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise TypeError(f"fault kind {cls.kind!r}: {cls.__qualname__} and "
                            f"{old.__qualname__} both declare it")
        kinds.register(own)
        CLASSES[cls.kind] = cls

    def __init__(self, target: str, run_id: str, ledger: Ledger):
        self.target = target
        self.run_id = run_id
        self.ledger = ledger
        self.entry: LedgerEntry | None = None
        self.undone: dict[str, Any] = {}  # what the last heal's undo did

    def root_reason(self) -> str | None:
        """Why this fault, as configured, needs root; None when it does not."""
        return self.privilege if self.needs_root else None

    @classmethod
    def root_reason_on(cls, gpu_backend: str) -> str | None:
        """Why this kind needs root on a machine whose co-tenant backend is
        ``gpu_backend`` ("cuda" with a GPU, else "cpu"), before any fault is
        made; None when it does not (faults.catalogue.unrunnable_kinds)."""
        return cls.privilege if cls.needs_root else None

    def _require_privilege(self) -> None:
        why = self.root_reason()
        if why is None or is_root():
            return
        raise PrivilegeError(
            f"{self.kind} on {self.target}: refused, it needs root ({why}) and this harness "
            f"runs as {user_name()} (uid {os.geteuid()}); nothing was changed. What to do: "
            f"run the suite as root (e.g. sudo -E .venv/bin/python -m pytest ...), or leave "
            f"{self.kind} out of the run (--faults without it)"
            + (f", or use {self.without_root}" if self.without_root else "") + ".")

    def _preflight(self) -> None:
        """Refuse early, before the ledger or the system is touched: raise
        FaultError if the target is missing, dead or not ours."""

    @abstractmethod
    def _inverse(self) -> dict[str, Any]:
        """How to heal, as plain data for the ledger: all that ``undo`` will
        have. ``_act`` may add to it (and re-record the entry) as it learns
        more, e.g. the pid of a helper it started."""

    @abstractmethod
    def _act(self) -> dict[str, Any]:
        """Break the thing. Returns what was done, for the history."""

    @classmethod
    @abstractmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Repair the thing from its ledger entry alone (``entry.inverse``,
        and ``entry.id`` where the fault named something after it). The one
        inverse: the live heal and heal-all both run it. Idempotent, and safe
        when already repaired, half done, or when what it acted on is gone.
        Returns what was done, for the history."""

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        """What ``undo`` did for heal-all, in one line."""
        return f"{healed(entry)}: {done or 'nothing to undo'}"

    def observe(self) -> Effect | None:
        """Look at the system's state, while the fault is still in, for its
        effect: a killed node's port refusing, a paused group in state T,
        packets matched by the chain, what the toxic acted on, a throttled
        cgroup, memory taken. Never the tool's own answer (that the rule was
        added, the signal sent). Called by ``heal`` just before it undoes
        the fault, when the evidence is at its fullest. None: this kind's
        effect is judged from the history instead (clock_drift: the answers'
        ``created`` stamps) or cannot be seen from here; fault_effective
        says which."""
        return None

    def _observed(self) -> dict[str, Any] | None:
        """``observe`` for the heal's result: an observation that fails is
        recorded as such (effective None, with the error); the heal goes on."""
        try:
            effect = self.observe()
        except Exception as e:  # noqa: BLE001 - the heal matters more than the figure
            return {"effective": None, "how": "the observation failed",
                    "error": f"{type(e).__name__}: {e}"}
        return None if effect is None else effect.to_dict()

    def _aftermath(self) -> dict[str, Any]:
        """In a live run, after ``observe`` and before ``undo``: what the
        fault left that only waiting shows (process_kill: the processes of
        the killed node still alive at its orphan bound, which ``undo``
        would end unseen). Returns what was found, for the history."""
        return {}

    def _recover(self) -> dict[str, Any]:
        """After ``undo``, in a live run only: bring back what needs the live
        cluster (restart a killed node, wait until it serves). A crashed
        harness's cluster went with it, so heal-all has nothing of this kind
        to do. Returns what was done, for the history."""
        return {}

    @property
    def active(self) -> bool:
        return self.entry is not None

    def inject(self) -> dict[str, Any]:
        if self.entry is not None:
            raise RuntimeError(f"{self.kind} on {self.target} is already injected")
        self._require_privilege()  # before anything, even the preflight's probes
        self._preflight()
        self.entry = self.ledger.record(
            LedgerEntry(self.kind, self.target, self.run_id, self._inverse()))
        try:
            acted = self._act()
        except BaseException:
            # Half-done is the worst state: undo whatever part of it happened.
            self.heal()
            raise
        return {"kind": self.kind, "target": self.target, "fault_id": self.entry.id, **acted}

    def heal(self) -> dict[str, Any]:
        if self.entry is None:
            return {"kind": self.kind, "target": self.target, "already_healed": True}
        effect = self._observed()
        aftermath = self._aftermath()
        self.undone = {**aftermath, **self.undo(self.entry)}  # _recover's messages may cite it
        try:
            recovered = self._recover()
        except FaultError as e:  # the heal ran; its record goes with the error
            e.record = {**self.undone, **e.record}
            raise
        done = {**self.undone, **recovered}
        fault_id = self.entry.id
        self.ledger.remove(fault_id)
        self.entry = None
        out = {"kind": self.kind, "target": self.target, "fault_id": fault_id, **done}
        if effect is not None:
            out["effect"] = effect
        return out

    def __enter__(self) -> "Fault":
        self.inject()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()
