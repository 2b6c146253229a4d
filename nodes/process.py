"""Processes the suite starts: labelled, grouped, and always ended by id.

Every node runs in a session (and process group) of its own, so a signal to
the group reaches the whole tree (vLLM's API server *and* its EngineCore and
workers) and nothing else. Every process carries ORDEAL_* variables in its
environment (the label), and a record of each group is written to the state
directory, so a harness that was SIGKILLed leaves something the next run can
find and end (``ordeal.ownership``: the labels, the records and
``reap_leftovers``). We never kill by name: only by the process-group id we
created, after checking the label.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Mapping, Sequence

from ordeal.config import redact_argv
from ordeal.history.ops import utc_iso
from ordeal.ownership import (
    CLUSTER_ENV,
    NODE_ENV,
    OWNER_PID_ENV,
    Owner,
    ProcessRecord,
    remove_record,
    write_record,
)
from ordeal.procfs import group_members
from ordeal.procfs import start_time as _proc_start_time

#: Where the harness code lives: every child process gets it on PYTHONPATH
#: (vLLM loads engines.vllm.node_header from there).
REPO_ROOT = Path(__file__).resolve().parent.parent


class ManagedProcess:
    """One labelled process group of cluster ``cluster_id``, with a log file
    and a process record naming ``owner`` (by default this harness; a Ray
    actor starting an engine names the harness that placed it)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cluster_id: str,
        cwd: Path | None = None,
        owner: Owner | None = None,
        cpus: tuple[int, ...] | None = None,
    ):
        self.name = name
        self.cpus = cpus  # the cores it (and its children) may run on; None: any
        self.cwd = cwd  # None: the harness's own working directory
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.cluster_id = cluster_id
        self.owner = owner
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._record: ProcessRecord | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if self.is_running():
            raise RuntimeError(f"{self.name}: already running as pid {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        owner = self.owner or Owner.current()
        env = {**self.env, CLUSTER_ENV: self.cluster_id, NODE_ENV: self.name,
               "ORDEAL_LOG_DIR": str(self.log_path.parent), OWNER_PID_ENV: str(owner.pid)}
        with self.log_path.open("ab") as log:
            # The banner's time is where a restart's phases are counted from
            # (engines.vllm.startup). Its command line, like the record's, is
            # redacted: a log and a state file are files a secret never reaches.
            log.write(f"\n=== ordeal: start #{self.starts + 1} of {self.name} at {utc_iso()}: "
                      f"{' '.join(redact_argv(self.argv))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd,
                # Set in the child before exec, so no import runs elsewhere first.
                preexec_fn=(None if self.cpus is None
                            else lambda: os.sched_setaffinity(0, self.cpus)),
            )
        self.starts += 1
        self._record = ProcessRecord(self.cluster_id, self.name, self.proc.pid,
                                     _proc_start_time(self.proc.pid),
                                     redact_argv(self.argv), owner)
        write_record(self._record)

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
            remove_record(self._record)

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                tail = deque(f.read().decode("utf-8", errors="replace").splitlines(), lines)
            return list(tail)
        except OSError as e:
            return [f"(no log at {self.log_path}: {e})"]

