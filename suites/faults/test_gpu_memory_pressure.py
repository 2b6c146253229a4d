"""gpu_memory_pressure: a co-tenant takes device memory next to a replica
(on a CPU-only machine: host memory, the CPU analog). The replica keeps
serving while it is held (it answers requests in the fault window); the
memory comes back after the heal (the helper that held it is gone and, on
the CPU analog, the machine's MemAvailable grows across the heal by at
least half the hog), and every request after the heal succeeds."""

import os

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def test_memory_is_taken_while_injected_and_returned_after_heal(ordeal_run):
    # On a GPU: a fifth of the device, which fits beside replicas that share
    # it (engines/vllm/gpus.py gives them 0.7 together); on CPU: 1 GiB of RAM.
    r = run_single_fault(ordeal_run, "gpu_memory_pressure", "replica-1",
                         {"mb": 1024, "fraction": 0.2})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    fault, after = r.phases["fault"], r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    got, healed = r.window["inject_result"], r.window["heal_result"]
    if got["analog"] == "memory-hog":
        # The hog really holds the memory (resident, not just reserved) ...
        rss = int(got["ready"].split("rss_bytes=")[1].split()[0])
        assert rss >= 1000 * 2**20, got
    # ... and the heal ended exactly it, so the memory is back.
    assert healed["ended_pids"] == [got["helper_pid"]], (got, healed)
    assert not os.path.exists(f"/proc/{got['helper_pid']}"), got
    if got["analog"] == "memory-hog":
        # The machine's MemAvailable grew by most of what the hog held (the
        # replicas under load move it too: half is the margin).
        assert healed["memory_back_mb"] >= healed["memory_held_mb"] / 2, healed
    assert fault.requests >= 10 and fault.nodes["replica-1"] >= 1, r.brief()
    assert after.ok_share == 1.0, r.brief()
    r.assert_verdict()  # the whole verdict, known findings applied
