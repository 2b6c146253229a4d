"""Processes the suite starts: labelled, grouped, and always ended by id.

Every node runs in a session (and process group) of its own, so a signal to
the group reaches the whole tree (vLLM's API server *and* its EngineCore and
workers) and nothing else. Every process carries ORDEAL_* variables in its
environment (the label), and a record of each group is written to the state
directory, so a harness that was SIGKILLed leaves something the next run can
find and end (``reap_leftovers``). We never kill by name: only by the
process-group id we created, after checking the label.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ordeal.config import state_dir
from ordeal.procfs import environ as _proc_environ
from ordeal.procfs import group_members
from ordeal.procfs import start_time as _proc_start_time
from ordeal.procfs import state as _proc_state

#: Where the harness code lives: every child process gets it on PYTHONPATH
#: (vLLM loads engines.vllm.node_header from there).
REPO_ROOT = Path(__file__).resolve().parent.parent

LABEL = "ORDEAL_RUN_ID"


@dataclass
class ProcessRecord:
    run_id: str
    name: str
    pgid: int
    start_time: str | None
    argv: list[str]
    owner_pid: int | None = None  # the harness that started it
    owner_start_time: str | None = None


class ManagedProcess:
    """One labelled process group with a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        run_id: str,
        cwd: Path | None = None,
    ):
        self.name = name
        self.cwd = cwd  # None: the harness's own working directory
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.run_id = run_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._record: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _record_path(self) -> Path:
        return state_dir() / "procs" / f"{self.run_id}-{self.name}.json"

    def start(self) -> None:
        if self.is_running():
            raise RuntimeError(f"{self.name}: already running as pid {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, LABEL: self.run_id, "ORDEAL_NODE": self.name,
               "ORDEAL_LOG_DIR": str(self.log_path.parent),
               "ORDEAL_OWNER_PID": str(os.getpid())}
        with self.log_path.open("ab") as log:
            log.write(f"\n=== ordeal: start #{self.starts + 1} of {self.name}: "
                      f"{' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd,
            )
        self.starts += 1
        rec = ProcessRecord(self.run_id, self.name, self.proc.pid,
                            _proc_start_time(self.proc.pid), self.argv,
                            os.getpid(), _proc_start_time(os.getpid()))
        self._record = self._record_path()
        self._record.parent.mkdir(parents=True, exist_ok=True)
        self._record.write_text(json.dumps(rec.__dict__))

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, signum: int) -> None:
        """Signal our process group. The group id is the pid we spawned with
        a new session; the kernel does not reuse it while any member lives."""
        if self.proc is None:
            raise RuntimeError(f"{self.name}: never started, nothing to signal")
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass  # the whole group is already gone

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, wait ``grace``, SIGKILL what is left, and wait
        until no member of the group remains."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if group_members(pgid):
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and group_members(pgid):
                self.proc.poll()
                time.sleep(0.1)
        if group_members(pgid):
            self.signal(signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and group_members(pgid):
                self.proc.poll()
                time.sleep(0.05)
        self.proc.poll()
        left = group_members(pgid)
        if left:
            raise RuntimeError(f"{self.name}: processes {left} of group {pgid} survived SIGKILL")
        if self._record is not None:
            self._record.unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                tail = deque(f.read().decode("utf-8", errors="replace").splitlines(), lines)
            return list(tail)
        except OSError as e:
            return [f"(no log at {self.log_path}: {e})"]


def _owner_alive(rec: ProcessRecord) -> bool:
    """The harness that started the group still runs (same pid, same start
    time): its processes are not leftovers, whatever their run id."""
    return (rec.owner_pid is not None and rec.owner_pid != os.getpid()
            and _proc_start_time(rec.owner_pid) == rec.owner_start_time)


def _leftover_members(rec: ProcessRecord) -> list[int]:
    """Members of the recorded group that are ours to end.

    A process group id cannot be reused while any member of the group lives,
    and only a leader creates a group. So if the leader is alive with its
    recorded start time, or gone, every member still in the group is one we
    started, including those that blanked their environment by renaming
    themselves (vLLM's "VLLM::EngineCore" does, so labels alone miss it).
    If a *different* process now leads a group with that id, only members
    carrying our label for that run are ours.
    """
    members = group_members(rec.pgid)
    leader_now = _proc_start_time(rec.pgid)
    if leader_now is None or leader_now == rec.start_time:
        return members
    return [pid for pid in members if _proc_environ(pid).get(LABEL) == rec.run_id]


def reap_leftovers(current_run: str | None = None) -> list[str]:
    """End process groups that earlier, crashed runs left behind.

    Skips the current run's groups and groups whose harness still runs
    (another suite on the same machine). Returns one line per action, for
    the terminal.
    """
    done: list[str] = []
    rec_dir = state_dir() / "procs"
    if not rec_dir.is_dir():
        return done
    killed: list[int] = []
    for path in sorted(rec_dir.glob("*.json")):
        try:
            rec = ProcessRecord(**json.loads(path.read_text()))
        except (ValueError, TypeError) as e:
            done.append(f"unreadable process record {path} ({e}); removed")
            path.unlink(missing_ok=True)
            continue
        if rec.run_id == current_run or _owner_alive(rec):
            continue
        ours = _leftover_members(rec)
        for pid in ours:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if ours:
            done.append(f"ended {len(ours)} leftover process(es) of {rec.name} "
                        f"from run {rec.run_id} (group {rec.pgid})")
        path.unlink(missing_ok=True)
    # "Ended" means gone: a SIGKILLed fault proxy still dying accepted the
    # heal's connection and reset it, so heal-all, run right after, kept
    # that run's toxic entry as unhealable (CI, test_endurance_resume).
    deadline = time.monotonic() + 10
    while killed and time.monotonic() < deadline:
        killed = [p for p in killed if _proc_state(p) not in (None, "Z")]
        if killed:
            time.sleep(0.05)
    if killed:
        done.append(f"{len(killed)} killed leftover process(es) still exist 10 s later: "
                    f"{killed[:10]} (uninterruptible sleep?); check them with ps")
    return done
