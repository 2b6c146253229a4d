"""heal-all undoes the ledger newest injection first, with each kind's one
inverse (``undo``): the same code the live heal runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import catalogue
from faults.base import Fault
from faults.heal_all import heal_all
from faults.ledger import Ledger, LedgerEntry


class Stacked(Fault):
    """Pushes its name on a stack file; undo pops it and refuses when its
    name is not on top: faults undone out of order fail, as stacked
    monkeypatches would restore a wrong value. Undone twice: a no-op."""

    kind = "test_stacked"

    def __init__(self, name: str, stack: Path, run_id: str, ledger: Ledger):
        super().__init__(name, run_id, ledger)
        self.stack = stack

    def _inverse(self):
        return {"stack": str(self.stack), "name": self.target}

    def _act(self):
        with self.stack.open("a") as f:
            f.write(self.target + "\n")
        return {}

    @classmethod
    def undo(cls, entry):
        stack = Path(entry.inverse["stack"])
        names = stack.read_text().splitlines() if stack.exists() else []
        name = entry.inverse["name"]
        if name not in names:
            return {"popped": None}
        if names[-1] != name:
            raise RuntimeError(f"{name} undone out of order: the stack is {names}")
        stack.write_text("".join(n + "\n" for n in names[:-1]))
        return {"popped": name}


@pytest.fixture
def stacked(monkeypatch):
    monkeypatch.setitem(catalogue.REGISTRY, Stacked.kind, Stacked)


def test_heal_all_undoes_the_newest_injection_first(tmp_path, stacked):
    """Ids that sort in no useful order (file names are ids): the heal
    follows the injection order, backwards."""
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    names = ["first", "second", "third", "fourth"]
    for name, fault_id in zip(names, ["m0", "a0", "z0", "b0"]):
        with stack.open("a") as f:
            f.write(name + "\n")
        ledger.record(LedgerEntry(Stacked.kind, name, "crashed-run",
                                  {"stack": str(stack), "name": name}, id=fault_id))
    assert [e.target for e in ledger.pending()] == names
    lines = heal_all(ledger)
    assert [line.split()[3] for line in lines] == names[::-1], lines
    assert all(line.startswith(f"healed {Stacked.kind} on ") for line in lines), lines
    assert stack.read_text() == "" and ledger.pending() == []


def test_faults_injected_live_and_left_by_a_crash_heal_in_reverse(tmp_path, stacked):
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    for name in ("outer", "middle", "inner"):
        Stacked(name, stack, "crashed-run", ledger).inject()  # never healed: the "crash"
    assert stack.read_text().split() == ["outer", "middle", "inner"]
    assert "FAILED" not in " ".join(heal_all(ledger))
    assert stack.read_text() == "" and ledger.pending() == []


def test_the_live_heal_runs_the_same_undo(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    fault = Stacked("only", stack, "live-run", ledger)
    fault_id = fault.inject()["fault_id"]
    assert fault.heal() == {"kind": Stacked.kind, "target": "only", "fault_id": fault_id,
                            "popped": "only"}
    assert stack.read_text() == "" and ledger.pending() == []
    assert fault.heal()["already_healed"] is True


def test_entries_from_before_the_sequence_come_first_and_unreadable_ones_last(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    new = ledger.record(LedgerEntry(Stacked.kind, "new", "r", {}, id="a1"))
    old = {"kind": Stacked.kind, "target": "old", "run_id": "r", "inverse": {}, "id": "z1",
           "injected": "2020-01-01T00:00:00.000Z", "owner": {"pid": 1, "start_time": "1"}}
    (ledger.dir / "z1.json").write_text(json.dumps(old))
    (ledger.dir / "b1.json").write_text("{not json")
    got = ledger.pending()
    assert [e.target for e in got[:2]] == ["old", "new"] and got[0].seq == 0 < new.seq
    assert isinstance(got[2], str) and "unreadable" in got[2]


def test_every_kind_has_one_inverse():
    """No second heal path to drift from the first: each kind undoes only
    through ``undo(entry)``."""
    for kind, cls in catalogue.REGISTRY.items():
        assert not hasattr(cls, "_undo") and not hasattr(cls, "heal_entry"), kind
        assert not getattr(cls, "__abstractmethods__", None), (kind, cls.__abstractmethods__)


def test_an_entry_of_the_previous_format_is_healed(tmp_path, stacked):
    """A harness of the previous release crashed and left an entry with
    owner_pid/owner_start: after the upgrade, heal-all still heals it."""
    stack = tmp_path / "stack"
    stack.write_text("old\n")
    ledger = Ledger(tmp_path / "ledger")
    ledger.dir.mkdir(parents=True)
    old = {"kind": Stacked.kind, "target": "old", "run_id": "r", "id": "c1",
           "inverse": {"stack": str(stack), "name": "old"},
           "injected": "2020-01-01T00:00:00.000Z", "owner_pid": 1, "owner_start": "gone"}
    (ledger.dir / "c1.json").write_text(json.dumps(old))
    [entry] = ledger.pending()
    assert entry.owner.pid == 1 and entry.owner.start_time == "gone" and not entry.owner.alive()
    lines = heal_all(ledger)
    assert stack.read_text() == "" and ledger.pending() == [], lines
