"""The disk a run will write, planned before its load starts (issue 44):
the estimate follows the measured bytes per request, a load that the free
space cannot hold twice is refused before anything starts, saying what to
change, and a real small disk (a tmpfs, root) is read as it is."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from load.spec import Distribution, WorkloadSpec
from ordeal.config import ConfigError
from runs.disk_plan import (
    FREE_FACTOR,
    mean_output_tokens,
    plan_disk,
    planned_requests,
    require_disk,
)

GB = 2**30


def test_a_72_hour_run_of_long_streams_is_estimated_near_the_measured_7_kb_a_request():
    """The 2 h 45 min endurance example wrote 7.1 KB a request of 200-400
    tokens; at 8 requests/s a 72-hour run is then about 15 GB."""
    spec = WorkloadSpec(duration_s=72 * 3600, rate=8.0, max_tokens=(200, 400))
    plan = plan_disk(spec, nodes=3, run_dir="/nonexistent/runs", free=100 * GB)
    assert plan.requests == 2_073_600 and plan.mean_output_tokens == 300
    per_request = plan.history_bytes / plan.requests
    assert 6_500 < per_request < 8_500, per_request
    assert 13 * GB < plan.history_bytes < 18 * GB
    assert plan.enough and plan.to_dict()["need_bytes"] == plan.need_bytes
    tight = plan_disk(spec, nodes=3, run_dir="/x", free=int(1.5 * plan.need_bytes))
    assert not tight.enough  # under twice the estimate
    with pytest.raises(ConfigError) as e:
        require_disk(tight)
    msg = str(e.value)
    assert f"under {FREE_FACTOR:g} x the estimate" in msg and "--runs-dir" in msg, msg
    assert "--load-rate" in msg and "2,073,600 requests of ~300 output tokens over 72.0 h" in msg


def test_output_lengths_come_from_the_workload():
    assert mean_output_tokens(WorkloadSpec()) == 20  # max_tokens (8, 32)
    assert mean_output_tokens(WorkloadSpec(output_tokens=Distribution("fixed", value=64))) == 64
    assert mean_output_tokens(WorkloadSpec(
        output_tokens=Distribution("lognormal", mean=300, sigma=0.5, max=2000))) == 300
    assert planned_requests(WorkloadSpec(duration_s=10, rate=8)) == 80
    assert planned_requests(WorkloadSpec(duration_s=10, mode="closed", concurrency=4)) == 40


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: mounting a small tmpfs needs root")
def test_a_run_dir_on_a_small_disk_is_refused_before_the_load(tmp_path):
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "ordeal-test-tmpfs", str(mnt)],
                   check=True)
    try:
        run_dir = mnt / "runs" / "not-made-yet"  # read from the nearest directory above
        hour = plan_disk(WorkloadSpec(duration_s=3600, rate=8), nodes=3, run_dir=run_dir)
        assert 1.5 * 2**20 < hour.free_bytes <= 2 * 2**20
        with pytest.raises(ConfigError, match="so the run does not start"):
            require_disk(hour)
        short = plan_disk(WorkloadSpec(duration_s=2, rate=8), nodes=3, run_dir=run_dir)
        require_disk(short)  # about 20 KB: fits
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
