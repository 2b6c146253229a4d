"""The ownership contract: what the suite started, who started it, and what
it may touch. One home for it, read by nodes, faults, clusters and heal-all.

- Labels: every process a cluster starts carries ``ORDEAL_CLUSTER_ID`` (its
  cluster id) and ``ORDEAL_NODE`` in its environment; a fault's helper
  process carries ``ORDEAL_RUN_ID`` (the test run that injected it) and
  ``ORDEAL_HELPER`` (a tag of its own).
- Owner: the harness that started something, named by its pid *and* that
  process's start time (a pid alone can be reused). What a harness that
  still runs owns is its own to end or heal; anything else is a leftover.
- Process records: one JSON file per process group a cluster starts, under
  ``$ORDEAL_STATE_DIR/procs``, so a harness that was SIGKILLed leaves enough
  for the next one to end its groups (``reap_leftovers``): by process-group
  id, after checking the record's owner is gone and, where the group's
  leader changed, the label. Never by name.
- Claims: cleanups can run at once (two pytest-xdist workers' session start,
  a second harness, ``python -m faults heal-all`` beside a starting suite),
  so a cleaner first takes a leftover by renaming it to a claim name of its
  own (``Claimer``: ``.<name>.claim.<owner label>.<token>``). The rename is
  atomic: exactly one cleaner wins and acts and reports; the others find it
  gone and skip it, as done by someone else. A claim whose claimer is gone
  is itself a leftover, and the next cleaner takes it over. Where order
  matters across cleaners (the ledger, newest first), ``exclusive`` holds a
  lock file for the whole pass.
- Allowed networks (ordeal/networks.py): loopback, plus networks the
  session names (the user's ``--allow-target``, the Docker cluster's own
  subnet) for as long as it names them. Load and faults refuse anything
  else before a byte is sent.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
import uuid
import weakref
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ordeal import procfs
from ordeal.config import state_dir

#: The cluster id, on every process a cluster starts (nodes, router, proxy).
CLUSTER_ENV = "ORDEAL_CLUSTER_ID"


#: The test run id, on every helper process a fault starts (co-tenants, the
#: clock strober): the run whose fault it serves.
RUN_ENV = "ORDEAL_RUN_ID"


#: The node a process belongs to (or a helper serves).
NODE_ENV = "ORDEAL_NODE"


#: A fault helper's own tag (a fresh uuid): what its heal matches on.
HELPER_ENV = "ORDEAL_HELPER"


#: The pid of the harness that started the process (for people reading ps).
OWNER_PID_ENV = "ORDEAL_OWNER_PID"


#: The clusters this process has made and still holds (cluster id -> the
#: cluster object). A reaper in this process never takes their groups for
#: leftovers: the session's cleanup can run after a test module's own
#: cluster started (its first use comes later), and it ended that live
#: cluster's fault proxy under the module's next test.
_LIVE_CLUSTERS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def hold_cluster(cluster_id: str, cluster: Any) -> None:
    """Mark ``cluster_id`` live for as long as ``cluster`` exists."""
    _LIVE_CLUSTERS[cluster_id] = cluster


# -- the owner ------------------------------------------------------------------

@dataclass(frozen=True)
class Owner:
    """The harness that started something: its pid and that process's start
    time (clock ticks since boot, /proc/<pid>/stat), which together name one
    process for good."""

    pid: int
    start_time: str | None

    @classmethod
    def current(cls) -> Owner:
        return cls(os.getpid(), procfs.start_time(os.getpid()))

    def alive(self) -> bool:
        """Another harness than this process, that very one (same pid, same
        start time), still runs: what it owns is its own to end or heal, not
        a leftover. This process is never "another": a cleanup it runs ends
        what it owns itself."""
        return (self.start_time is not None and self.pid != os.getpid()
                and procfs.start_time(self.pid) == self.start_time)

    def label(self) -> str:
        """``pid:start_time``: how a Docker label or a marker file names it."""
        return f"{self.pid}:{self.start_time}"

    @classmethod
    def from_label(cls, text: str | None) -> Owner | None:
        """The owner a ``label()`` names; None for anything else."""
        pid, sep, start = (text or "").strip().partition(":")
        if not sep or not pid.isdigit() or not start:
            return None
        return cls(int(pid), start)


# -- claims: one cleaner per leftover ---------------------------------------------

#: What a claim's name holds between the original name and the claimer.
CLAIM_MARK = ".claim."


def running(owner: Owner | None) -> bool:
    """``owner`` still runs: another process (``Owner.alive``) or this very
    one (another thread of it may be the claimer)."""
    return owner is not None and (owner.alive() or owner == Owner.current())


@dataclass(frozen=True)
class Claimer:
    """One cleanup pass: this process (its ``Owner``) and a token of its own,
    so that two passes of one process (threads) claim apart too."""

    owner: Owner
    token: str

    @classmethod
    def new(cls) -> Claimer:
        return cls(Owner.current(), uuid.uuid4().hex[:8])

    def name_for(self, original: Path) -> Path:
        """The claim name of ``original``: hidden, next to it, and naming
        the claimer, so listings of the originals (``*.json``,
        ``ordeal-ray-*``) never see it and the next cleaner can tell whether
        the claimer still runs."""
        return original.with_name(
            f".{original.name}{CLAIM_MARK}{self.owner.label()}.{self.token}")

    def claim(self, path: Path) -> Path | None:
        """Take ``path`` (a file or a directory) by renaming it to our claim
        name, atomically: of cleaners racing for it exactly one gets it.
        Returns where it lies now, or None when it is gone: someone else's
        (healed, ended or claimed meanwhile)."""
        return _moved(path, self.name_for(path))

    def take_over(self, claim: Path) -> Path | None:
        """Take a claim whose claimer is gone (a cleaner that died before it
        finished), renamed to our claim name as ``claim`` does. None when its
        claimer still runs or another cleaner took it first."""
        parsed = parse_claim(claim)
        if parsed is None or running(parsed[1]):
            return None
        return _moved(claim, self.name_for(parsed[0]))


def _moved(src: Path, dst: Path) -> Path | None:
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def parse_claim(path: Path) -> tuple[Path, Owner | None] | None:
    """A claim name's original path and claimer (None when the claimer's
    label is unreadable: a leftover claim); None for a name that is not a
    claim."""
    name = path.name
    if not name.startswith(".") or CLAIM_MARK not in name:
        return None
    original, _, rest = name[1:].rpartition(CLAIM_MARK)
    label, dot, token = rest.rpartition(".")
    if not original or not dot or not token:
        return None
    return path.with_name(original), Owner.from_label(label)


def left_claims(directory: Path) -> list[tuple[Path, Path]]:
    """Claims in ``directory`` whose claimer is gone, as (claim, original),
    in the originals' name order: leftovers for the next cleaner."""
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        parsed = parse_claim(directory / name)
        if parsed is not None and not running(parsed[1]):
            out.append((directory / name, parsed[0]))
    return sorted(out, key=lambda c: c[1].name)


def held_claims(directory: Path, me: Claimer) -> list[tuple[Path, Path]]:
    """Claims in ``directory`` that another running cleaner holds, as
    (claim, original): what it is ending now, for ``me`` to wait for."""
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        parsed = parse_claim(directory / name)
        if (parsed is not None and running(parsed[1])
                and directory / name != me.name_for(parsed[0])):
            out.append((directory / name, parsed[0]))
    return out


def give_back(claim: Path, original: Path) -> None:
    """Put a claimed file back where it was (its cleaner could not finish:
    it stays a leftover for a later one). Never over a newer file of that
    name: then the claim is simply dropped."""
    try:
        os.link(claim, original)
    except FileExistsError:
        pass
    except FileNotFoundError:
        return
    except OSError:  # no hard links on this file system
        os.rename(claim, original)
        return
    claim.unlink(missing_ok=True)


class Busy(TimeoutError):
    """A lock another cleaner held for longer than we would wait."""


@contextmanager
def exclusive(lock: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Hold the lock file ``lock`` (flock: released when the holder ends,
    however it ends) for the ``with`` block, waiting for another holder up
    to ``timeout_s``; ``Busy`` after that, naming the holder."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                    raise Busy(f"{lock} held by {holder or 'another process'} for more than "
                               f"{timeout_s:.0f} s") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid:start_time {Owner.current().label()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# -- process records ------------------------------------------------------------

@dataclass(frozen=True)
class ProcessRecord:
    """One process group a cluster started: its leader's pid (the group id)
    and start time, and the harness that owns it."""

    cluster_id: str
    name: str
    pgid: int
    start_time: str | None
    argv: list[str]
    owner: Owner | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessRecord:
        """A record as ``write_record`` stored it; TypeError/ValueError for
        anything else. A record of the previous format (``run_id`` for the
        cluster, ``owner_pid``/``owner_start_time``) still loads, so heal-all
        ends what a crashed harness of the previous release left."""
        if "run_id" in data and "cluster_id" not in data:
            data = {k: v for k, v in data.items()
                    if k not in ("run_id", "owner_pid", "owner_start_time")} | {
                "cluster_id": data["run_id"],
                "owner": ({"pid": data["owner_pid"], "start_time": data.get("owner_start_time")}
                          if data.get("owner_pid") is not None else None)}
        owner = data.get("owner")
        return cls(**{**data, "owner": Owner(**owner) if owner is not None else None})


def records_dir() -> Path:
    return state_dir() / "procs"


def record_path(cluster_id: str, name: str) -> Path:
    return records_dir() / f"{cluster_id}-{name}.json"


def write_record(rec: ProcessRecord) -> Path:
    """Store ``rec`` (whole or not at all: a reaper may read it any time)."""
    path = record_path(rec.cluster_id, rec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(rec)))
    os.replace(tmp, path)
    return path


def remove_record(rec: ProcessRecord) -> None:
    record_path(rec.cluster_id, rec.name).unlink(missing_ok=True)


@dataclass(frozen=True)
class StoredRecord:
    """A record file as read: the record, or why it could not be read."""

    path: Path
    record: ProcessRecord | None
    error: str | None = None


def read_record(path: Path) -> StoredRecord | None:
    """The record file at ``path``; None when it is gone (ended, or claimed
    by a reaper, meanwhile)."""
    try:
        return StoredRecord(path, ProcessRecord.from_dict(json.loads(path.read_text())))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        return StoredRecord(path, None, f"{type(e).__name__}: {e}")


def read_records() -> list[StoredRecord]:
    """Every record file, in name order (a cluster's records by node name);
    claimed ones (being reaped) are not listed."""
    directory = records_dir()
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [s for s in map(read_record, paths) if s is not None]


def record_of_group(pgid: int) -> ProcessRecord | None:
    """The record of the group ``pgid`` if its leader is still the recorded
    process (same start time), else None."""
    leader_start = procfs.start_time(pgid)
    if leader_start is None:
        return None
    for stored in read_records():
        rec = stored.record
        if rec is not None and rec.pgid == pgid and rec.start_time == leader_start:
            return rec
    return None


# -- ending what a crashed harness left ------------------------------------------

def leftover_members(rec: ProcessRecord) -> list[int]:
    """Members of the recorded group that are ours to end.

    A process group id cannot be reused while any member of the group lives,
    and only a leader creates a group. So if the leader is alive with its
    recorded start time, or gone, every member still in the group is one we
    started, including those that blanked their environment by renaming
    themselves (vLLM's "VLLM::EngineCore" does, so labels alone miss it).
    If a *different* process now leads a group with that id, only members
    carrying the record's cluster label are ours.
    """
    members = procfs.group_members(rec.pgid)
    leader_now = procfs.start_time(rec.pgid)
    if leader_now is None or leader_now == rec.start_time:
        return members
    return [pid for pid in members if procfs.environ(pid).get(CLUSTER_ENV) == rec.cluster_id]


def wait_gone(pids: Collection[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` exists (a zombie counts as gone); returns
    those still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if procfs.state(p) not in (None, "Z")]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if procfs.state(p) not in (None, "Z")]
    return left


def reap_leftovers(current_cluster: str | None = None,
                   clusters: Collection[str] | None = None) -> list[str]:
    """End the process groups that crashed harnesses left behind, and
    return once they are gone. One line per action, for the terminal.

    Skips ``current_cluster``'s groups and groups whose owner still runs
    (another suite on this machine); with ``clusters``, only those clusters'
    groups are looked at. A record whose groups were ended is removed.

    Safe beside other reapers: each record is claimed (``Claimer``) before
    anything is done, so each group is ended and reported by exactly one of
    them; a record claimed by another is skipped without a word, but its
    members are waited for all the same. A claim whose reaper died is taken
    over.
    """
    me = Claimer.new()
    done: list[str] = []
    killed: list[int] = []
    # Our claims are kept until what we killed is gone: a reaper that lists
    # the records meanwhile sees them held (``held_claims``) and waits too.
    claimed: list[Path] = []
    try:
        held = held_members(me)
        elsewhere = _reap_pass(me, current_cluster, clusters, done, killed, claimed)
        left = wait_gone([*killed, *elsewhere, *held])
        if set(left) - set(killed):
            # Another reaper's groups still there: if it died before it ended
            # them, its claims are leftovers now; take them over.
            elsewhere = _reap_pass(me, current_cluster, clusters, done, killed, claimed)
            left = wait_gone([*killed, *elsewhere])
    finally:
        for claim in claimed:
            claim.unlink(missing_ok=True)
    # "Ended" means gone: a SIGKILLed fault proxy still dying accepted the
    # heal's connection and reset it, so heal-all, run right after, kept
    # that run's toxic entry as unhealable.
    left = [p for p in left if p in killed]
    if left:
        done.append(f"{len(left)} killed leftover process(es) still exist 10 s later: "
                    f"{left[:10]} (uninterruptible sleep?); check them with ps")
    return done


def held_members(me: Claimer) -> list[int]:
    """The live members of the groups other running reapers are ending now
    (their claimed records): ``reap_leftovers`` returns once they are gone."""
    out: list[int] = []
    for claim, original in held_claims(records_dir(), me):
        held = read_record(claim) if original.suffix == ".json" else None
        if held is not None and held.record is not None:
            out += leftover_members(held.record)
    return out


def _reap_pass(me: Claimer, current_cluster: str | None, clusters: Collection[str] | None,
               done: list[str], killed: list[int], claimed: list[Path]) -> list[int]:
    """One pass over the records and left claims: claim, end, report (the
    claims go to ``claimed``, for the caller to remove once the killed are
    gone). Returns the members of leftover groups another reaper claimed."""
    elsewhere: list[int] = []
    candidates = [(stored, stored.path) for stored in read_records()]
    for claim, original in left_claims(records_dir()):
        stored = read_record(claim) if original.suffix == ".json" else None
        if stored is not None:
            candidates.append((stored, original))
    for stored, original in candidates:
        rec = stored.record
        if rec is not None and (
                (clusters is not None and rec.cluster_id not in clusters)
                or rec.cluster_id == current_cluster
                or rec.cluster_id in _LIVE_CLUSTERS
                or (rec.owner is not None and rec.owner.alive())):
            continue
        # Only its owner writes a record, and this one's is gone: what was
        # read is what is claimed.
        mine = me.claim(original) if stored.path == original else me.take_over(stored.path)
        if mine is None:  # another reaper has it: it ends and reports it
            if rec is not None:
                elsewhere += leftover_members(rec)
            continue
        try:
            if rec is None:
                done.append(f"unreadable process record {original} ({stored.error}); removed")
            else:
                ours = leftover_members(rec)
                for pid in ours:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                if ours:
                    done.append(f"ended {len(ours)} leftover process(es) of {rec.name} "
                                f"from cluster {rec.cluster_id} (group {rec.pgid})")
        except BaseException:
            give_back(mine, original)  # still a leftover, for the next reaper
            raise
        claimed.append(mine)
    return elsewhere
