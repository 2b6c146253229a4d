"""heal-all undoes the ledger newest injection first, with each kind's one
inverse (``undo``): the same code the live heal runs. Two at once heal each
entry once, still newest first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import HEALTH_SERVER, at_once, pids_alive
from faults import catalogue, iptables
from faults.base import Fault
from faults.heal_all import heal_all
from faults.ledger import Ledger, LedgerEntry
from faults.ray_node import RAY_OWNER_FILE, RAY_TEMP_PREFIX
from ordeal import procfs
from ordeal.ownership import Claimer, Owner

REPO = Path(__file__).resolve().parent.parent


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


def dead_owner() -> Owner:
    """The owner identity of a process that ran and is gone."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        return Owner(proc.pid, procfs.start_time(proc.pid))
    finally:
        proc.kill()
        proc.wait()


def crashed_entries(ledger: Ledger, stack: Path, names: list[str]) -> list[LedgerEntry]:
    """``names`` pushed on ``stack`` in order, each with the ledger entry a
    harness that is gone left."""
    gone = dead_owner()
    out = []
    for name in names:
        with stack.open("a") as f:
            f.write(name + "\n")
        out.append(ledger.record(LedgerEntry(Stacked.kind, name, "crashed-run",
                                             {"stack": str(stack), "name": name}, owner=gone)))
    return out


def ledger_files(ledger: Ledger) -> list[str]:
    """What is left in the ledger dir: entries and claims (not the lock)."""
    return sorted(n for n in os.listdir(ledger.dir) if n != ".heal.lock")


HEAL_SETUP = ("from faults import catalogue\nfrom faults.heal_all import heal_all\n"
              "from faults.ledger import Ledger\nfrom test_heal_all import Stacked\n"
              "catalogue.REGISTRY[Stacked.kind] = Stacked")


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_two_heal_alls_at_once_heal_each_entry_once_newest_first(tmp_path, stacked, mode):
    """Two xdist workers' session cleanups (or heal-all beside a starting
    suite) over the same ledger: every entry healed and reported exactly
    once, in reverse injection order (Stacked refuses any other), and the
    ledger empty after."""
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    names = [f"fault-{i}" for i in range(8)]
    crashed_entries(ledger, stack, names)
    results = at_once(mode, HEAL_SETUP,
                      f"result = heal_all(Ledger({str(ledger.dir)!r}))", tmp_path)
    lines = [line for result in results for line in result]
    healed = [line.split()[3] for line in lines if line.startswith(f"healed {Stacked.kind} on ")]
    assert sorted(healed) == sorted(names) and len(lines) == len(names), results
    # The pass that healed them went newest first.
    assert [n for result in results for n in (x.split()[3] for x in result)] == names[::-1]
    assert stack.read_text() == "" and ledger.pending() == [] and ledger_files(ledger) == []


def test_a_claim_left_by_a_dead_heal_all_is_taken_over_and_a_live_ones_left_alone(
        tmp_path, stacked):
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    first, second = crashed_entries(ledger, stack, ["first", "second"])
    live = subprocess.Popen(["sleep", "600"])
    try:
        # A heal-all claimed "second" and died before its undo; another,
        # still running, holds "first".
        left = Claimer(dead_owner(), "dead0000").claim(ledger.path(second.id))
        held = Claimer(Owner(live.pid, procfs.start_time(live.pid)), "live0000").claim(
            ledger.path(first.id))
        assert left is not None and held is not None
        # Claimed entries are still open until healed: listed, in order.
        assert [e.target for e in ledger.pending()] == ["first", "second"]
        lines = heal_all(ledger)
        assert [line.split()[3] for line in lines] == ["second"], lines
        assert stack.read_text() == "first\n"  # the live heal-all's to undo
        assert ledger_files(ledger) == [held.name]
    finally:
        live.kill()
        live.wait()


def test_an_entry_whose_heal_fails_goes_back_for_a_later_heal_all(tmp_path, stacked):
    ledger = Ledger(tmp_path / "ledger")
    stack = tmp_path / "stack"
    [entry] = crashed_entries(ledger, stack, ["under"])
    with stack.open("a") as f:
        f.write("over\n")  # pushed by no fault of the ledger: "under" cannot pop
    [line] = heal_all(ledger)
    assert line.startswith(f"FAILED to heal {Stacked.kind} on under ({entry.id}): "
                           "RuntimeError: under undone out of order"), line
    assert line.endswith(f"the entry stays in {ledger.dir} for a later heal-all")
    assert ledger_files(ledger) == [f"{entry.id}.json"]  # back, open, no claim left
    stack.write_text("under\n")
    assert [x.split()[3] for x in heal_all(ledger)] == ["under"]
    assert stack.read_text() == "" and ledger_files(ledger) == []


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_two_cleanups_at_once_remove_each_ray_temp_dir_once(tmp_path, mode):
    """heal-all's Ray leftovers (faults.ray_node.remove_temp_dirs) from two
    cleanups at once: each dead harness's temp dir removed and reported
    once, a claim left by a dead cleanup taken over, a live harness's dir
    and an unmarked one untouched."""
    live = subprocess.Popen(["sleep", "600"])
    try:
        tmp = tmp_path / "tmp"
        gone = dead_owner()
        dirs = {}
        for name in [f"{RAY_TEMP_PREFIX}{i:08x}" for i in range(6)] + ["live", "unmarked"]:
            d = tmp / (name if name.startswith(RAY_TEMP_PREFIX) else RAY_TEMP_PREFIX + name)
            (d / "session_latest" / "logs").mkdir(parents=True)
            (d / "session_latest" / "logs" / "raylet.out").write_text("x" * 1000)
            owner = Owner(live.pid, procfs.start_time(live.pid)) if name == "live" else gone
            if name != "unmarked":
                (d / RAY_OWNER_FILE).write_text(f"{owner.label()}\ncluster-{name}\n")
            dirs[name] = d
        # A cleanup that died mid-way left its claim on the first one.
        first = dirs.pop(f"{RAY_TEMP_PREFIX}{0:08x}")
        assert Claimer(dead_owner(), "dead0000").claim(first) is not None
        setup = "from pathlib import Path\nfrom faults.ray_node import remove_temp_dirs"
        results = at_once(mode, setup, f"result = remove_temp_dirs(Path({str(tmp)!r}))",
                          tmp_path)
        lines = sorted(line for result in results for line in result)
        dead = [first, *[d for n, d in dirs.items() if n not in ("live", "unmarked")]]
        assert lines == sorted(f"removed leftover Ray temp dir {d}" for d in dead), results
        assert sorted(os.listdir(tmp)) == [dirs["live"].name, dirs["unmarked"].name]
    finally:
        live.kill()
        live.wait()


CRASHING_HARNESS = r"""
import os, sys, time
from pathlib import Path
from faults import Ledger
from faults.network_partition import NetworkPartition
from faults.process_pause import ProcessPause
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint
cluster, logs, server = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
nodes = []
for name in ("replica-0", "replica-1"):
    port = free_ports(1)[0]
    proc = ManagedProcess(name, [sys.executable, "-c", server, str(port), "0"], dict(os.environ),
                          logs / f"{name}.log", cluster)
    node = LocalNode(name, "replica", Endpoint("127.0.0.1", port), proc, hint="test server")
    node.start()
    node.wait_ready(30)
    nodes.append(node)
ProcessPause(nodes[0], "crash-run", Ledger()).inject()
NetworkPartition(nodes[1], "crash-run", Ledger()).inject()
print("INJECTED", *(n.pid for n in nodes), flush=True)
time.sleep(600)  # the heals never come: SIGKILL arrives first
"""


def processes_labelled(cluster: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"ORDEAL_CLUSTER_ID={cluster}".encode() in env:
                out.append(int(entry))
    return out


@pytest.mark.needs("iptables as root (the partition this harness leaves behind)",
                   iptables.unavailable_reason)
def test_heal_all_alone_gives_the_machine_back_after_a_sigkilled_harness(tmp_path):
    """A harness with a live cluster, a paused node and a partitioned one is
    SIGKILLed; `python -m faults heal-all` alone then leaves no process of
    it, no stopped process, no iptables chain and no ledger entry."""
    cluster = f"crash-{uuid.uuid4().hex[:6]}"
    (tmp_path / "logs").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CRASHING_HARNESS, cluster,
                              str(tmp_path / "logs"), HEALTH_SERVER],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("INJECTED"), f"the harness did not inject (rc {child.poll()})"
        paused, cut = (int(x) for x in line.split()[1:])
        child.kill()
        child.wait(10)
        assert Path(f"/proc/{paused}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        left = processes_labelled(cluster)
        assert paused in left and cut in left and len(left) >= 4  # two servers, two children
        ids = [e.id for e in Ledger().pending()]
        assert len(ids) == 2 and any(f"ORDEAL-{i}" in iptables_rules() for i in ids)
    finally:
        if child.poll() is None:
            child.kill()
    done = subprocess.run([sys.executable, "-m", "faults", "heal-all"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "healed network_partition on replica-1" in done.stdout, done.stdout
    assert "healed process_pause on replica-0" in done.stdout, done.stdout
    assert done.stdout.count(f"from cluster {cluster}") == 2, done.stdout  # both groups ended
    assert pids_alive(left) == [] and processes_labelled(cluster) == []
    assert not any(f"ORDEAL-{i}" in iptables_rules() for i in ids)
    assert Ledger().pending() == []


def iptables_rules() -> str:
    return subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
