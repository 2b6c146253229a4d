"""Ending a co-tenant helper (faults/cotenant.py end_helper): when it
returns, the helper is gone from /proc, not left a zombie. The race it had:
a SIGKILLed 1 GB memory hog takes a while to exit, reads as gone (a zombie
has no start time) before it is reaped, and stayed in /proc; the
gpu_memory_pressure suite caught it. Planted here without the race: the
helper is killed first and left a zombie, as it is for that moment."""

import os
import signal
import time

from faults.cotenant import end_helper, helper_alive, helper_argv, new_tag, spawn_helper
from ordeal.procfs import state


def hog():
    helper = spawn_helper(helper_argv("memory", "--mb", "256"), "t-end", "replica-x", new_tag())
    rec = helper.as_dict()
    assert helper_alive(rec) and os.path.exists(f"/proc/{helper.pid}")
    return helper, rec


def test_an_ended_memory_hog_is_gone_from_proc():
    helper, rec = hog()
    assert end_helper(rec) == [helper.pid]
    assert not os.path.exists(f"/proc/{helper.pid}")
    assert end_helper(rec) == []  # idempotent


def test_a_helper_that_is_already_a_zombie_is_reaped():
    helper, rec = hog()
    os.kill(helper.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while state(helper.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state(helper.pid) == "Z" and not helper_alive(rec)  # reads as gone ...
    end_helper(rec)
    assert not os.path.exists(f"/proc/{helper.pid}")  # ... and is gone now
