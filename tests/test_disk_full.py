"""The run directory's disk fills up (issue 11): the history says which op
could not be written and stays readable up to its last whole line; a run
stops its load at once, heals the fault it holds, and raises that error.

A real full disk: a tmpfs of a few hundred KB, mounted by the test (root).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from faults.factory import build_faults
from faults.ledger import Ledger
from faults.proxy.client import ProxyClient
from load.spec import WorkloadSpec
from ordeal.history.reader import read_history
from ordeal.history.writer import History, HistoryWriteError
from reports.run_dir import RunDir
from runs.run import OrdealRun, PlannedFault

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="not root: mounting a small tmpfs needs root")


@contextlib.contextmanager
def small_disk(tmp_path: Path, size_kb: int):
    """A tmpfs of ``size_kb`` KB at a fresh directory, unmounted after."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "ordeal-test-tmpfs",
                    str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_history_on_a_full_disk_names_the_op_and_keeps_what_was_written(tmp_path):
    with small_disk(tmp_path, 64) as disk:
        h = History(disk / "history.jsonl")
        written = 0
        with pytest.raises(HistoryWriteError) as e:
            for i in range(100_000):
                h.append("info", "monitor", "sample", {"i": i, "pad": "x" * 200})
                written += 1
        msg = str(e.value)
        assert f"cannot write op {written}" in msg and "No space left" in msg, msg
        assert f"intact up to op {written - 1}" in msg and "Free space on" in msg, msg
        with contextlib.suppress(OSError):
            h.close()
        problems: list[str] = []
        ops = list(read_history(disk / "history.jsonl", on_error=problems.append))
        # Every op that append returned is there, in order, apart from those
        # of a last chunk whose trailer could not be written (said, not lost
        # silently).
        assert [op.value["i"] for op in ops] == list(range(len(ops)))
        assert written - len(ops) <= 4096, (written, len(ops), problems)
        assert len(ops) == written or problems, (written, len(ops))


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_run_whose_disk_fills_stops_heals_and_says_why(ordeal_cluster, ordeal_say, tmp_path):
    link = ordeal_cluster.link("client-router")
    proxy = ProxyClient(link.control)
    # The disk holds twice the load's planned size (runs/disk_plan.py lets it
    # start); 3 s in, another writer takes all but 64 KB of it.
    with small_disk(tmp_path, 4096) as disk:
        run = OrdealRun(RunDir.create(disk, "disk-full"), "disk-full", ordeal_cluster,
                        ordeal_say)
        [fault] = build_faults("network_latency", "client-router", ordeal_cluster, run.run_id,
                               Ledger(), random.Random(0), {"latency_ms": 50})
        spec = WorkloadSpec(duration_s=120.0, rate=8.0, seed=3, max_tokens=(16, 32))

        def fill() -> None:
            with open(disk / "another-writer", "wb") as f:
                os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(disk).free - (64 << 10))
        filler = threading.Timer(3.0, fill)
        filler.start()
        try:
            with pytest.raises(HistoryWriteError, match="cannot write op") as e:
                run.load(spec, faults=[PlannedFault(fault, after_s=2.0, hold_s=100.0)],
                         max_s=150)
        finally:
            filler.cancel()
            filler.join()
        assert run.summary_extra["disk_plan"]["enough"] is True
        ordeal_say(f"disk full: {e.value}")
        # Healed at once, not at the end of its 100 s hold: no toxic is left.
        assert proxy.toxics(link.name) == []
        assert not fault.active
        assert not [x for x in Ledger().pending()
                    if not isinstance(x, str) and x.run_id == run.run_id]
        with contextlib.suppress(OSError):
            run.history.close()
        problems: list[str] = []
        ops = list(read_history(run.run_dir.history_path, on_error=problems.append))
        assert ops and [op.index for op in ops] == list(range(len(ops))), problems
        injects = [op for op in ops if op.process == "nemesis" and op.f == "inject"]
        assert injects, "the inject was recorded before the disk filled"
