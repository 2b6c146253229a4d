"""The ownership contract (ordeal.ownership) against real processes: an
owner is alive only while that very process runs; leftover process groups
are ended by heal-all only when their owner is gone, and are gone when it
returns; load and faults reach only allowed networks."""

from __future__ import annotations

import gc
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import at_once, pids_alive
from ordeal import procfs
from ordeal.networks import AllowedNetworks, NotOurs
from ordeal.ownership import (
    CLUSTER_ENV,
    Claimer,
    Owner,
    ProcessRecord,
    hold_cluster,
    read_records,
    reap_leftovers,
    record_path,
    records_dir,
    write_record,
)
from ordeal.topology import Endpoint

REPO = Path(__file__).resolve().parent.parent


def sleeper(**env: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own: ``sh`` with a ``sleep`` child
    (both in its process group), and ``env`` added to its environment."""
    proc = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600; wait"],
                            env={**os.environ, **env}, start_new_session=True)
    deadline = time.monotonic() + 10
    while len(procfs.group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(procfs.group_members(proc.pid)) >= 2
    return proc


def owner_of(proc: subprocess.Popen[bytes]) -> Owner:
    return Owner(proc.pid, procfs.start_time(proc.pid))


def dead_owner() -> Owner:
    """The owner identity of a process that ran and is gone."""
    proc = subprocess.Popen(["sleep", "600"])
    owner = owner_of(proc)
    proc.kill()
    proc.wait()
    return owner


def record(cluster_id: str, name: str, proc: subprocess.Popen[bytes],
           owner: Owner | None) -> ProcessRecord:
    rec = ProcessRecord(cluster_id, name, proc.pid, procfs.start_time(proc.pid),
                        ["sh", "-c", "sleep"], owner)
    write_record(rec)
    return rec


def end(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and, when it leads one, its process group."""
    try:
        if procfs.pgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait(10)


def test_an_owner_is_alive_only_while_that_very_process_runs():
    proc = subprocess.Popen(["sleep", "600"])
    try:
        owner = owner_of(proc)
        assert owner.alive()
        assert not Owner(proc.pid, "1").alive()  # same pid, another process
        assert Owner.from_label(owner.label()) == owner
        assert Owner.from_label("not-an-owner") is None and Owner.from_label(None) is None
    finally:
        proc.kill()
        proc.wait()
    assert not owner.alive()
    # This process is the one cleaning up: what it owns is never "another's".
    assert not Owner.current().alive()


def test_heal_all_ends_a_dead_owners_group_and_leaves_a_live_owners_alone(tmp_path):
    orphan = sleeper(**{CLUSTER_ENV: "cluster-dead"})
    kept = sleeper(**{CLUSTER_ENV: "cluster-live"})
    live_owner = subprocess.Popen(["sleep", "600"])
    try:
        orphan_members = procfs.group_members(orphan.pid)
        kept_members = procfs.group_members(kept.pid)
        record("cluster-dead", "sleeper", orphan, dead_owner())
        record("cluster-live", "sleeper", kept, owner_of(live_owner))
        done = subprocess.run([sys.executable, "-m", "faults", "heal-all"], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (f"ended {len(orphan_members)} leftover process(es) of sleeper from cluster "
                f"cluster-dead (group {orphan.pid})") in done.stdout.splitlines(), done.stdout
        # Gone when heal-all returns, not merely signalled.
        assert pids_alive(orphan_members) == []
        assert not record_path("cluster-dead", "sleeper").exists()
        # Its owner still runs: not a leftover.
        assert "cluster-live" not in done.stdout
        assert pids_alive(kept_members) == kept_members
        assert [s.record.cluster_id for s in read_records() if s.record] == ["cluster-live"]
    finally:
        for proc in (orphan, kept, live_owner):
            end(proc)


def test_a_record_of_the_previous_format_is_still_reaped(tmp_path):
    """A harness of the previous release (records with ``run_id`` for the
    cluster and ``owner_pid``) crashed: after the upgrade heal-all still ends
    its group."""
    orphan = sleeper(ORDEAL_RUN_ID="cluster-old")
    gone = dead_owner()
    try:
        members = procfs.group_members(orphan.pid)
        old = {"run_id": "cluster-old", "name": "replica-0", "pgid": orphan.pid,
               "start_time": procfs.start_time(orphan.pid), "argv": ["sh"],
               "owner_pid": gone.pid, "owner_start_time": gone.start_time}
        records_dir().mkdir(parents=True, exist_ok=True)
        (records_dir() / "cluster-old-replica-0.json").write_text(json.dumps(old))
        [stored] = read_records()
        assert stored.record.cluster_id == "cluster-old" and stored.record.owner == gone
        lines = reap_leftovers()
        assert lines == [f"ended {len(members)} leftover process(es) of replica-0 from cluster "
                         f"cluster-old (group {orphan.pid})"], lines
        assert pids_alive(members) == [] and read_records() == []
    finally:
        end(orphan)


def test_a_group_led_by_another_process_now_loses_only_its_labelled_members():
    # The record names a leader start time that is not this leader's: the
    # group id was reused, so only members carrying the cluster label are ours.
    unlabelled = sleeper()
    labelled = sleeper(**{CLUSTER_ENV: "cluster-reused"})
    try:
        for proc in (unlabelled, labelled):
            write_record(ProcessRecord("cluster-reused", f"g{proc.pid}", proc.pid, "1",
                                       ["sh"], dead_owner()))
        members = procfs.group_members(labelled.pid)
        lines = reap_leftovers()
        assert lines == [f"ended {len(members)} leftover process(es) of g{labelled.pid} "
                         f"from cluster cluster-reused (group {labelled.pid})"]
        assert pids_alive(members) == []
        assert len(pids_alive(procfs.group_members(unlabelled.pid))) >= 2
        assert read_records() == []  # both records are closed
    finally:
        end(unlabelled)
        end(labelled)


def test_the_current_cluster_is_skipped_and_an_unreadable_record_is_reported():
    proc = sleeper(**{CLUSTER_ENV: "cluster-now"})
    try:
        record("cluster-now", "sleeper", proc, dead_owner())
        bad = record_path("cluster-x", "bad")
        bad.write_text("{not json")
        lines = reap_leftovers(current_cluster="cluster-now")
        assert len(lines) == 1 and lines[0].startswith(f"unreadable process record {bad}")
        assert not bad.exists()
        assert pids_alive([proc.pid]) == [proc.pid]
    finally:
        end(proc)


def test_a_cluster_this_process_holds_is_never_its_leftover():
    """A session cleanup that runs after a test module's own cluster started
    must leave that live cluster alone; once the cluster object is gone,
    what it left is a leftover like any other."""
    proc = sleeper(**{CLUSTER_ENV: "cluster-held"})
    try:
        record("cluster-held", "fault-proxy", proc, Owner.current())
        members = procfs.group_members(proc.pid)

        class Cluster:
            pass
        cluster = Cluster()
        hold_cluster("cluster-held", cluster)
        assert reap_leftovers() == []
        assert pids_alive(members) == members
        del cluster
        gc.collect()
        assert reap_leftovers() == [f"ended {len(members)} leftover process(es) of fault-proxy "
                                    f"from cluster cluster-held (group {proc.pid})"]
        assert pids_alive(members) == []
    finally:
        end(proc)


REAP_SETUP = "from ordeal.ownership import reap_leftovers\nfrom conftest import pids_alive"
# Each reaper also says which leftover members still ran when it returned:
# none, the loser's too ("returns once they are gone").
REAP_BODY = ("lines = reap_leftovers()\n"
             "result = lines + [f'still {p}' for p in pids_alive(MEMBERS)]")


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_two_reapers_at_once_end_each_leftover_group_exactly_once(tmp_path, mode):
    """Two xdist workers' session cleanups right after a crashed run, over
    the same records: each group is claimed by one of them, ended and
    reported once; neither fails on a record the other removed."""
    n = 6
    groups = []
    try:
        for _ in range(n):
            groups.append(sleeper(**{CLUSTER_ENV: "cluster-crashed"}))
        gone = dead_owner()
        per_group = []
        for i, proc in enumerate(groups):
            record("cluster-crashed", f"replica-{i}", proc, gone)
            per_group.append(procfs.group_members(proc.pid))
        members = [pid for group in per_group for pid in group]
        results = at_once(mode, REAP_SETUP, f"MEMBERS = {members!r}\n{REAP_BODY}", tmp_path)
        lines = [line for result in results for line in result]
        assert not [x for x in lines if x.startswith("still ")], results
        ended = sorted(x for x in lines if x.startswith("ended "))
        assert ended == sorted(
            f"ended {len(per_group[i])} leftover process(es) of replica-{i} from cluster "
            f"cluster-crashed (group {proc.pid})" for i, proc in enumerate(groups)), results
        assert len(lines) == n, results  # nothing else: no error, no second report
        assert pids_alive(members) == []
        assert os.listdir(records_dir()) == []  # no record, no claim left
    finally:
        for proc in groups:
            end(proc)


def test_a_claim_left_by_a_dead_reaper_is_taken_over_and_a_live_ones_left_alone():
    dead_claimed = sleeper(**{CLUSTER_ENV: "cluster-a"})
    live_claimed = sleeper(**{CLUSTER_ENV: "cluster-b"})
    live_reaper = subprocess.Popen(["sleep", "600"])
    try:
        gone = dead_owner()
        dead_members = procfs.group_members(dead_claimed.pid)
        live_members = procfs.group_members(live_claimed.pid)
        # A reaper claimed cluster-a's record and died before it ended the
        # group; another, still running, holds cluster-b's.
        record("cluster-a", "replica-0", dead_claimed, gone)
        left = Claimer(dead_owner(), "dead0000").claim(record_path("cluster-a", "replica-0"))
        record("cluster-b", "replica-0", live_claimed, gone)
        held = Claimer(owner_of(live_reaper), "live0000").claim(
            record_path("cluster-b", "replica-0"))
        assert left is not None and held is not None and read_records() == []
        lines = reap_leftovers()
        assert lines == [f"ended {len(dead_members)} leftover process(es) of replica-0 from "
                         f"cluster cluster-a (group {dead_claimed.pid})"]
        assert pids_alive(dead_members) == [] and not left.exists()
        # The live reaper's claim is its own: untouched, its group too.
        assert pids_alive(live_members) == live_members and held.exists()
        assert sorted(os.listdir(records_dir())) == [held.name]
    finally:
        for proc in (dead_claimed, live_claimed, live_reaper):
            end(proc)


def test_allowed_networks_refuse_outside_loopback_until_allowed_and_after_undo():
    nets = AllowedNetworks()
    nets.require_ours(Endpoint("127.0.0.1", 80), "load")
    nets.require_ours(Endpoint("localhost", 80), "load")
    nets.require_ours(Endpoint("::1", 80), "load")
    with pytest.raises(NotOurs, match="load: refusing to touch 10.9.8.7:80"):
        nets.require_ours(Endpoint("10.9.8.7", 80), "load")
    with pytest.raises(NotOurs, match="not an IP address"):
        nets.require_ours(Endpoint("example.com", 80), "load")
    first = nets.allow("10.9.8.0/24")
    second = nets.allow(ipaddress.ip_network("10.9.8.0/24"))  # a second holder of the same
    nets.require_ours(Endpoint("10.9.8.7", 80), "packet_loss")
    first.undo()
    first.undo()  # once only: the second allowance still holds
    nets.require_ours(Endpoint("10.9.8.7", 80), "packet_loss")
    with second:
        pass
    with pytest.raises(NotOurs, match="refusing to touch"):
        nets.require_ours(Endpoint("10.9.8.7", 80), "packet_loss")
    assert nets.networks == [ipaddress.ip_network("127.0.0.0/8"),
                             ipaddress.ip_network("::1/128")]
    with pytest.raises(NotOurs, match="'10.0.0.0/33': not a network"):
        nets.allow("10.0.0.0/33")
