"""Heal from the ledger alone, with no live objects: after a crash, that is
all there is. Each entry is undone by its kind's one inverse
(``Fault.undo``, the same code the live heal runs), newest first.

Safe beside another heal-all (another xdist worker's session start, a
``python -m faults heal-all`` beside a starting suite): one pass holds the
ledger's heal lock at a time, and each entry is claimed before its undo
runs, so it is healed, and reported, exactly once.

A hook entry's heal is a shell command (faults/hook.py): it runs only from a
ledger file that is the user's own and no one else may write
(``faults.ledger.untrusted``); any other is left in place with what to do."""

from __future__ import annotations

from collections.abc import Callable

from ordeal.containers import remove_leftovers as remove_docker_leftovers
from ordeal.ownership import Busy, Claimer, reap_leftovers

from .catalogue import REGISTRY
from .hook import HookFault
from .ledger import Ledger, LedgerEntry, untrusted
from .ray_node import remove_leftovers as remove_ray_leftovers


def clean_up(ledger: Ledger, say: Callable[[str], None], force: bool = False) -> list[str]:
    """Everything crashed harnesses left behind, in the one safe order, for
    ``python -m faults heal-all`` and every suite start alike: their process
    groups first (no heal may reach a process still dying), then the
    ledger's faults (``heal_all``), then Docker containers and networks by
    label, then Ray temp dirs and cgroups by owner marker. Each line goes to
    ``say``; returns the ledger's lines (what heal-all counts)."""
    for line in reap_leftovers():
        say(line)
    healed = heal_all(ledger, force=force)
    for line in healed:
        say(line)
    for line in (*remove_docker_leftovers(), *remove_ray_leftovers()):
        say(line)
    return healed


def heal_entry(entry: LedgerEntry) -> str:
    """Undo one entry; what was done, in one line. A hook's entry (an
    external deployment's fault) is undone by its heal hook, whatever its
    kind."""
    cls = HookFault if entry.inverse.get("via") == "hook" else REGISTRY.get(entry.kind)
    if cls is None:
        return f"closed unknown fault kind {entry.kind!r} on {entry.target}: no healer known"
    return cls.heal_line(entry, cls.undo(entry))


def heal_all(ledger: Ledger, skip_run: str | None = None, force: bool = False,
             lock_timeout_s: float = 600.0) -> list[str]:
    """Heal every entry (except those of ``skip_run``, a live run's own, and,
    unless ``force``, those whose harness still runs: another pytest-xdist
    worker or suite on this machine, whose faults are not leftovers).
    An entry whose heal fails goes back to the ledger and its line says why,
    so a later ``heal-all`` can retry; nothing is dropped silently.
    Newest injection first: a fault injected over another is undone before
    it, as monkeypatch undoes its changes. An entry another heal-all healed
    or holds is skipped without a word: it reports it."""
    if not ledger.dir.is_dir():
        return []
    try:
        with ledger.healing(lock_timeout_s):
            return _heal_pending(ledger, skip_run, force)
    except Busy as e:
        return [f"left the ledger {ledger.dir} to another heal-all: {e}"]


def _heal_pending(ledger: Ledger, skip_run: str | None, force: bool) -> list[str]:
    me = Claimer.new()
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
        claimed = ledger.claim(entry.id, me)
        if claimed is None:
            continue  # healed meanwhile, or being healed: someone else's
        claim, entry = claimed
        refused = untrusted(claim) if entry.inverse.get("via") == "hook" else None
        if refused is not None:
            ledger.give_back(claim, entry.id)
            path = ledger.path(entry.id)
            lines.append(
                f"REFUSED to run the heal hook of {entry.kind} on {entry.target} ({entry.id}) "
                f"from the ledger file {path}: {refused}. A ledger file's heal is run as a shell "
                f"command, so only one that is yours and that no one else may write is run. If "
                f"it is yours: chown it (and {ledger.dir}) to yourself, chmod go-w both, and run "
                f"python -m faults heal-all again; if not, heal by hand "
                f"({entry.inverse.get('heal_shown') or 'see the file'}) and delete the file")
            continue
        try:
            line = heal_entry(entry)
        except Exception as e:  # noqa: BLE001 - report, give the entry back, go on
            ledger.give_back(claim, entry.id)
            lines.append(f"FAILED to heal {entry.kind} on {entry.target} ({entry.id}): "
                         f"{type(e).__name__}: {e}; the entry stays in {ledger.dir} for a "
                         "later heal-all")
            continue
        except BaseException:
            ledger.give_back(claim, entry.id)
            raise
        ledger.close(claim)
        lines.append(line)
    return lines
