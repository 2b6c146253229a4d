"""A CPU quota on a node's own processes, through the cpu cgroup controller.

Why a quota and not a competing load: on these machines the kernel's
autogroup scheduling gives every session an equal share of the CPU, so a
busy-loop co-tenant in its own session left a vLLM CPU replica's throughput
unchanged (436.8 tok/s before, 435.7 during). A CFS quota caps the node
itself, whatever else runs: the kernel lets its processes run for at most
``quota_us`` per ``period_us`` in total, then stops them until the next
period.

What this module does, and all it does: create one cgroup named for the
suite (``<cpu mount>/ordeal-<tag>``), set its quota, move the node's
processes into it (writing a pid to ``cgroup.procs`` moves all its
threads), and later move them back to the cgroup each came from and remove
the cgroup. It never writes to a cgroup it did not create, except to put a
process of the node back where it was.

Everything heal needs is in the plan (plain data, written to the ledger
before anything moves): each pid with its start time and original cgroup.
Heal reads the ordeal cgroup's own ``cgroup.procs``, so children the node
forked while throttled (born inside it) go back too: to their parent's
original cgroup when the parent is known, else to the cgroup most of the
node's processes came from.

cgroup v1 (``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``) is what runs here
and is tested. cgroup v2 (``cpu.max``) is handled the same way when the cpu
controller is already enabled in the root's ``cgroup.subtree_control``; we
never enable it ourselves (that file belongs to the machine's owner). The v2
path was run once by hand on a v2 host (16 CPUs): a busy loop held to
cpu.max "80000 100000" got 0.81 CPU, nr_throttled rose, and heal put it back
in its original cgroup and removed ours; no test here covers it.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import FaultError
from .cotenant import node_cpus, proc_start_time

#: Where the kernel lists mounts; a module attribute so tests can point it
#: at a file that describes another machine.
MOUNTS = "/proc/self/mounts"
PREFIX = "ordeal-"
MIN_QUOTA_US = 1000  # the kernel refuses a quota below 1 ms


@dataclass(frozen=True)
class CpuController:
    """Where the cpu controller is mounted and which cgroup version it is."""

    mount: str
    version: int  # 1 or 2


def cpu_controller(kind: str = "cgroup") -> CpuController:
    """Find the cpu controller: a cgroup v1 mount whose options name ``cpu``
    (alone, or with cpuacct), else a cgroup v2 mount whose root has cpu in
    both ``cgroup.controllers`` and ``cgroup.subtree_control``. Raise a
    FaultError that says what is missing otherwise."""
    v2_mounts = []
    for line in Path(MOUNTS).read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return CpuController(mount, 1)
        if fstype == "cgroup2":
            v2_mounts.append(mount)
    problems = []
    for mount in v2_mounts:
        controllers = _read_words(Path(mount) / "cgroup.controllers")
        subtree = _read_words(Path(mount) / "cgroup.subtree_control")
        if "cpu" in controllers and "cpu" in subtree:
            return CpuController(mount, 2)
        if "cpu" in controllers:
            problems.append(f"cgroup v2 at {mount} has the cpu controller but does not enable it "
                            f"for children (cgroup.subtree_control is {' '.join(subtree) or 'empty'})"
                            f"; its owner can run: echo +cpu > {mount}/cgroup.subtree_control")
        else:
            problems.append(f"cgroup v2 at {mount} has no cpu controller (cgroup.controllers: "
                            f"{' '.join(controllers) or 'empty'}; it may be bound to v1 elsewhere)")
    raise FaultError(
        f"{kind}: no usable cpu cgroup controller: no cgroup v1 mount with the cpu controller in "
        f"{MOUNTS}" + (f", and {'; '.join(problems)}" if problems else ", and no cgroup v2 mount")
        + ". Mount one (e.g. mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu) or run on a "
        "machine that has one")


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def cgroup_of(pid: int, ctl: CpuController) -> str | None:
    """The pid's cgroup in the cpu hierarchy, as /proc/PID/cgroup says
    (e.g. ``/`` or ``/user.slice``); None if the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if ctl.version == 1 and "cpu" in controllers.split(","):
            return path
        if ctl.version == 2 and hierarchy == "0" and controllers == "":
            return path
    return None


def _dir(ctl_mount: str, path: str) -> Path:
    return Path(ctl_mount) / path.lstrip("/")


def plan_quota(name: str, pids: list[int], fraction: float, period_us: int,
               kind: str = "cgroup") -> dict[str, Any]:
    """Check everything and change nothing: return the plan (what apply does
    and what restore undoes), or raise FaultError saying why it cannot work.

    The quota is ``fraction`` of the CPUs the node may run on (the union of
    its processes' affinities): fraction x period x ncpus."""
    if not 0 < fraction < 1:
        raise FaultError(f"{kind}: cpu_fraction={fraction} must be between 0 and 1 (the share "
                         "of the node's CPUs it keeps)")
    if not 1000 <= period_us <= 1_000_000:
        raise FaultError(f"{kind}: period_us={period_us} must be between 1000 and 1000000 "
                         "(the kernel's limits for cpu.cfs_period_us)")
    if os.geteuid() != 0:
        raise FaultError(f"{kind}: moving processes between cgroups needs root (euid is "
                         f"{os.geteuid()}); run the suite as root or skip this fault")
    ctl = cpu_controller(kind)
    if not os.access(ctl.mount, os.W_OK):
        raise FaultError(f"{kind}: the cpu cgroup mount {ctl.mount} is not writable here "
                         "(read-only, as in many containers); run where it is writable")
    directory = _dir(ctl.mount, name)
    if directory.exists():
        raise FaultError(f"{kind}: {directory} already exists; another fault owns it "
                         "(run python -m faults heal-all if a run crashed)")
    procs = []
    for pid in sorted(pids):
        start, path = proc_start_time(pid), cgroup_of(pid, ctl)
        if start is None or path is None:
            continue  # exited since it was listed
        if not _dir(ctl.mount, path).is_dir():
            raise FaultError(f"{kind}: pid {pid} is in cpu cgroup {path!r}, which is not under "
                             f"{ctl.mount} as seen here (another cgroup namespace?); it could "
                             "not be put back, so nothing was moved")
        if path.rstrip("/").rsplit("/", 1)[-1].startswith(PREFIX):
            raise FaultError(f"{kind}: pid {pid} is already in ordeal cgroup {path}; heal that "
                             "fault first (python -m faults heal-all)")
        procs.append({"pid": pid, "start_time": start, "cgroup": path})
    if not procs:
        raise FaultError(f"{kind}: the node has no live process to throttle (pids {pids}); "
                         "is it running?")
    ncpus = len(node_cpus([p["pid"] for p in procs]))
    # Where a child born inside goes back to when its parent is unknown: the
    # cgroup most of the node's processes came from.
    paths = [p["cgroup"] for p in procs]
    home = max(set(paths), key=paths.count)
    quota_us = max(MIN_QUOTA_US, round(fraction * period_us * ncpus))
    return {"version": ctl.version, "mount": ctl.mount, "dir": str(directory),
            "period_us": period_us, "quota_us": quota_us, "ncpus": ncpus, "fraction": fraction,
            "procs": procs, "home": home}


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _move(pid: int, cgroup_dir: Path) -> bool:
    """Move a process (all its threads) into ``cgroup_dir``; False if it is
    gone (ESRCH), which is not an error: there is nothing left to move."""
    try:
        _write(cgroup_dir / "cgroup.procs", str(pid))
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
        raise
    return True


def procs_in(cgroup_dir: Path) -> list[int]:
    """Processes in a cgroup (its cgroup.procs); [] when it does not exist."""
    try:
        return [int(x) for x in (cgroup_dir / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def cpu_stat(cgroup_dir: Path) -> dict[str, int]:
    """The cgroup's cpu.stat (v1: nr_periods, nr_throttled, throttled_time
    in ns; v2: usage_usec, nr_throttled, throttled_usec ...)."""
    try:
        text = (cgroup_dir / "cpu.stat").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}


def apply(plan: dict[str, Any]) -> list[int]:
    """Create the cgroup, set its quota, move the planned processes in.
    Returns the pids moved (a process that exited meanwhile is skipped).
    On any error the caller heals with ``restore(plan)``."""
    directory = Path(plan["dir"])
    directory.mkdir()
    if plan["version"] == 1:
        _write(directory / "cpu.cfs_period_us", str(plan["period_us"]))
        _write(directory / "cpu.cfs_quota_us", str(plan["quota_us"]))
    else:
        _write(directory / "cpu.max", f"{plan['quota_us']} {plan['period_us']}")
    moved = []
    for proc in plan["procs"]:
        if proc_start_time(proc["pid"]) == proc["start_time"] and _move(proc["pid"], directory):
            moved.append(proc["pid"])
    if not moved:
        raise RuntimeError(f"every process of the node exited before it could be moved into "
                           f"{directory}; is the node dying?")
    return moved


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _move_back(pid: int, mount: str, candidates: list[str]) -> bool:
    """Move ``pid`` to the first candidate cgroup that still exists (its
    original one may have been removed meanwhile, e.g. a systemd scope);
    the hierarchy's root is the last resort, where a process starts."""
    for path in candidates:
        try:
            return _move(pid, _dir(mount, path))
        except FileNotFoundError:
            continue
    raise RuntimeError(f"could not move pid {pid} to any of {candidates} under {mount}")


def restore(plan: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    """Move every process still in the ordeal cgroup back, then remove it.

    A recorded process (same pid and start time) goes back to its own
    original cgroup; one born inside (a child forked while throttled) to its
    parent's original cgroup, else to the node's usual one (``home``).
    Idempotent: when the cgroup is already gone there is nothing to do.
    A process moved elsewhere by someone else is left where it is."""
    directory = Path(plan["dir"])
    mount = plan["mount"]
    if not directory.is_dir():
        return {"cgroup": str(directory), "moved_back": [], "removed": False,
                "already_healed": True}
    original = {(p["pid"], p["start_time"]): p["cgroup"] for p in plan["procs"]}

    def destination(pid: int) -> str:
        own = original.get((pid, proc_start_time(pid)))
        if own is not None:
            return own
        ppid = _parent(pid)
        return original.get((ppid, proc_start_time(ppid)), plan["home"]) if ppid else plan["home"]

    moved_back: list[int] = []
    stat = cpu_stat(directory)
    deadline = time.monotonic() + timeout_s
    while True:
        inside = procs_in(directory)
        for pid in inside:  # a process may fork while we move: loop until empty
            if _move_back(pid, mount, [destination(pid), plan["home"], "/"]):
                moved_back.append(pid)
        try:
            directory.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError as e:
            # EBUSY: a process still inside (just forked, or still exiting).
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise RuntimeError(f"could not remove {directory} ({e}); processes still in it: "
                                   f"{procs_in(directory)}; move them out (echo PID > "
                                   f"{mount}/cgroup.procs) and rmdir it") from e
            time.sleep(0.05)
    return {"cgroup": str(directory), "moved_back": sorted(set(moved_back)), "removed": True,
            "cpu_stat": stat}
