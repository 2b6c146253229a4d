"""pytest-xdist: each worker runs its own cluster, and nothing is shared.

The isolation test runs two workers (``pytest -n 2``) with one real replica
each: one cuts its replicas off while the other checks its own still answer.
The planning and merging are pure and tested on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordeal.config import ConfigError
from ordeal.workers import plan_workers, visible_gpus, worker_index
from reports.merge import merge_summaries

REPO = Path(__file__).resolve().parent.parent


def test_each_worker_gets_its_own_gpus():
    plans = [plan_workers(f"gw{i}", 4, 1, 64.0, 8, 2) for i in range(4)]
    assert [p.gpus for p in plans] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert plans[2].cuda_visible_devices == "4,5"
    assert plan_workers("main", 1, 2, 64.0, 0, 0).cuda_visible_devices is None
    assert worker_index("gw12") == 12


def test_each_worker_gets_cores_of_its_own_when_there_are_enough():
    two = [plan_workers(f"gw{i}", 2, 1, 64.0, 0, 0, cpus=(0, 1, 2, 3)) for i in range(2)]
    assert [p.cpus for p in two] == [(0, 2), (1, 3)]
    assert plan_workers("gw0", 3, 1, 64.0, 0, 0, cpus=(0, 1)).cpus == ()  # too few: share
    assert plan_workers("main", 1, 2, 64.0, 0, 0, cpus=(0, 1)).cpus == ()  # alone: all


def test_cuda_device_i_is_the_workers_i_th_gpu_as_nvml_counts_them():
    assert visible_gpus(None, 4) == [0, 1, 2, 3]
    assert visible_gpus("4,5", 8) == [4, 5]
    assert visible_gpus("2,9,3", 4) == [2]  # CUDA stops at the first GPU it cannot use
    assert visible_gpus("", 4) == []


def test_a_run_that_cannot_fit_fails_at_start_with_the_arithmetic():
    with pytest.raises(ConfigError, match=r"3 worker\(s\).*2 replica\(s\) x 3 GB \+ 1 GB .* = "
                                          r"7 GB, so 21 GB in all, and 20.0 GB is available"):
        plan_workers("gw0", 3, 2, 20.0, 0, 0)
    with pytest.raises(ConfigError, match=r"2 worker\(s\) x --gpus-per-worker 1 = 2 GPU\(s\); "
                                          "this machine has 1"):
        plan_workers("gw0", 2, 1, 64.0, 1, 1)


def summary(run_id, verdict, invoked, ok, valid):
    return {"run_id": run_id, "verdict": verdict, "worker": None,
            "ops": {"invoked": invoked, "ok": ok, "fail": invoked - ok, "info": 0, "nemesis": 2},
            "invariants": [{"name": "no_silent_loss", "valid": True},
                           {"name": "slo_latency", "valid": valid}],
            "cluster": {"backend": "local"}}


def test_merged_counts_add_up_and_verdicts_combine():
    a, b = summary("r-a", "pass", 100, 100, True), summary("r-b", "fail", 50, 40, False)
    merged = merge_summaries([a, b], {"r-a": "gw0", "r-b": "gw1"})
    assert merged["ops"] == {"invoked": 150, "ok": 140, "fail": 10, "info": 0, "nemesis": 4}
    assert merged["verdict"] == "fail" and merged["workers"] == ["gw0", "gw1"]
    by_name = {i["name"]: i for i in merged["invariants"]}
    assert by_name["no_silent_loss"]["valid"] is True
    assert by_name["slo_latency"]["valid"] is False
    assert by_name["slo_latency"]["runs"] == {"r-a": True, "r-b": False}
    both_pass = merge_summaries([a, summary("r-c", "pass", 1, 1, True)])
    assert both_pass["verdict"] == "pass"
    unknown = merge_summaries([a, summary("r-d", "unknown", 1, 1, "unknown")])
    assert unknown["verdict"] == "unknown"


def test_a_session_summary_is_refused_as_a_baseline_with_its_runs_named(tmp_path):
    from reports.baseline import BaselineError, load_baseline
    from reports.merge import write_session
    merged = merge_summaries([summary("r-a", "pass", 1, 1, True)])
    path = write_session(tmp_path, "session-x", merged)
    with pytest.raises(BaselineError, match="is a session summary .* one of its runs instead: r-a"):
        load_baseline(path)


@pytest.mark.cluster
def test_two_workers_run_two_clusters_and_a_fault_stays_in_its_own(tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "ORDEAL_XDIST_SYNC": str(sync)}
    env.pop("ORDEAL_STATE_DIR", None)  # each worker's test gets its own (tests/conftest.py)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "each",
         "tests/xdist_case/case_isolation.py", "--replicas", "1", "--runs-dir",
         str(tmp_path / "runs"), "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "2 passed" in out, out[-2000:]
    seen = json.loads((sync / "observed").read_text())
    assert seen and all(seen)
    gw0, gw1 = (json.loads((sync / f"gw{i}.json").read_text()) for i in (0, 1))
    assert set(gw0["ports"]).isdisjoint(gw1["ports"]) and gw0["state"] != gw1["state"]
