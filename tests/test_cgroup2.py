"""The suite's own cgroup v2 directories (``ordeal/cgroup2.py``), made and
removed for real: a process born in one is seen there, a cgroup holding a
live process is reported and not removed, and names outside ``/ordeal-*``
are refused before anything is touched. ``ray_node_partition`` relies on
all of it (each simulated Ray node runs in a cgroup of its own)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from ordeal import cgroup2

NO_CGROUPS = cgroup2.unavailable_reason()


def test_the_cgroup2_mount_is_found_in_a_mounts_table():
    hybrid = ("cgroup /sys/fs/cgroup/memory cgroup rw 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    assert str(cgroup2.mount_point(hybrid)) == "/sys/fs/cgroup/unified"
    assert str(cgroup2.mount_point("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")) == "/sys/fs/cgroup"
    assert cgroup2.mount_point("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n") is None


@pytest.mark.parametrize("bad", ["", "/", "system.slice", "/user.slice/ordeal-x",
                                 "/ordeal-x/../system.slice"])
def test_a_cgroup_that_is_not_the_suite_s_is_refused(bad):
    with pytest.raises(ValueError, match="only /ordeal-"):
        cgroup2.check_name(bad)
    with pytest.raises(ValueError, match="only /ordeal-"):
        cgroup2.remove(bad)


@pytest.mark.skipif(NO_CGROUPS is not None, reason=f"cannot make cgroups here: {NO_CGROUPS}")
def test_a_process_born_in_a_cgroup_is_seen_there_and_its_cgroup_removed_after_it():
    rel = f"/ordeal-test-{uuid.uuid4().hex[:8]}/node"
    top = "/" + rel.split("/")[1]
    path = cgroup2.make(rel)
    child = None
    try:
        assert path.is_dir() and top in cgroup2.ours()
        # The child joins before it execs: what it forks is born there too.
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys, time; from ordeal import cgroup2; "
             "from pathlib import Path; cgroup2.join(Path(sys.argv[1])); "
             "print('in', flush=True); time.sleep(60)", str(path)],
            stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "in"
        assert cgroup2.procs(path) == [child.pid]
        busy = cgroup2.remove(top, wait_s=0.5)
        assert busy and str(child.pid) in busy[0] and path.is_dir(), busy
        child.kill()
        child.wait(10)
        assert cgroup2.remove(top) == [] and not path.exists()
        assert top not in cgroup2.ours()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        cgroup2.remove(top)
