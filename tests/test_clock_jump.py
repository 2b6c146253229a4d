"""A clock jumps backwards under the harness (issue 11).

(a) A replica's wall clock jumps back an hour (clock_drift, offset -3600 s,
    through libfaketime) while load runs: vLLM stamps ``created`` with it,
    and the harness must not turn that into a negative duration, a crash or
    a request counted in the wrong window.
(b) The harness's own wall clock steps back an hour mid-run: a child
    harness runs under libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1, so
    only CLOCK_REALTIME moves, as a real settimeofday or NTP step would.
    Durations and windows come from the monotonic clock: the run ends
    cleanly, its history is whole and ordered by index and time_ns, and
    summary.json's ``duration_s`` is right although ``ended`` is an hour
    before ``started``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from harness_checks import negative_durations, pair_requests, read_intact

from faults.clock_drift import EFFECT_DELAY_S, offset_spec
from ordeal.faketime import faketime_env, read_clock, write_clock
from reports.run_dir import RunDir
from runs.run import OrdealRun
from runs.single_fault import run_single_fault, split_by_phase

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "clock_child.py"


def epoch(wall: str) -> float:
    return datetime.fromisoformat(wall.replace("Z", "+00:00")).timestamp()


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_replica_clock_jumping_back_an_hour_breaks_no_duration_or_window(ordeal_cluster,
                                                                         ordeal_say, tmp_path):
    run = OrdealRun(RunDir.create(tmp_path, "replica-clock-back"), "replica-clock-back",
                    ordeal_cluster, ordeal_say)
    r = run_single_fault(run, "clock_drift", "replica-0", {"mode": "offset", "offset_s": -3600},
                         inject_at_s=4.0, hold_s=8.0, load_s=16.0, rate=5.0, after_heal_s=5.0)
    steady, fault, after = r.phases["steady"], r.phases["fault"], r.phases["after_heal"]
    # The jump happened on the replica (vLLM's "created" is an hour behind)...
    assert abs(fault.median_skew("replica-0") + 3600) <= 3, r.brief()
    assert abs(steady.median_skew("replica-0")) <= 3, r.brief()
    assert abs(fault.median_skew("replica-1")) <= 3, r.brief()  # only the target moved
    # ... and is healed: the file is neutral again.
    assert read_clock(ordeal_cluster.node("replica-0").clock_file) == "+0 x1"
    # Nothing the harness measures went negative or broke.
    ops = read_intact(run.run_dir.history_path)
    pairs = pair_requests(ops)
    assert not negative_durations(ops), negative_durations(ops)[:5]
    assert not [d.error for _, d in pairs if "harness error" in str(d.error)]
    assert fault.ok_share == after.ok_share == 1.0, r.brief()
    assert not r.summary["errors"], r.summary["errors"]
    crashed = [i for i in r.summary["invariants"] if "error" in (i.get("details") or {})]
    assert not crashed, crashed
    # Windows are the harness's: every request the replica answered an hour
    # behind was sent while the fault was in (allowing the file's cache delay).
    nem = [o for o in ops if o.process == "nemesis"]
    inject_begin = next(o.time_ns for o in nem if o.f == "inject")
    heal_end = [o.time_ns for o in nem if o.f == "heal" and o.value.get("phase") == "end"][-1]
    skewed = [inv for inv, done in pairs if isinstance(done.value.get("created"), int)
              and done.value["created"] - epoch(inv.wall) < -1800]
    assert skewed, "no answer carried the jumped clock"
    late = [inv.index for inv in skewed
            if not inject_begin <= inv.time_ns <= heal_end + EFFECT_DELAY_S * 1e9]
    assert not late, f"requests {late} saw the jumped clock outside the fault window"
    assert sum(fault.types.values()) > 0 and sum(after.types.values()) > 0, r.brief()


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_harness_wall_clock_stepping_back_mid_run_ends_cleanly(ordeal_cluster, ordeal_say,
                                                               tmp_path):
    c = ordeal_cluster
    spec = {"nodes": [{"name": n.name, "role": n.role, "host": n.endpoint.host,
                       "port": n.endpoint.port, "pid": n.pid,
                       "log": str(n.process.log_path)} for n in c.nodes],
            "links": [{"name": x.name, "src": x.src, "dst": x.dst,
                       "listen": [x.listen.host, x.listen.port],
                       "upstream": [x.upstream.host, x.upstream.port],
                       "control": [x.control.host, x.control.port]} for x in c.links],
            "duration_s": 22.0, "rate": 4.0, "inject_at_s": 4.0, "hold_s": 12.0,
            "after_heal_s": 5.0, "latency_ms": 1000}
    clock = tmp_path / "harness.faketime"
    write_clock(clock, "+0")
    env = {**os.environ, **faketime_env(clock), "PYTHONPATH": str(REPO)}
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    child = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path / "runs"),
                              json.dumps(spec)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    injected = threading.Event()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip())
            if "nemesis: inject" in line:
                injected.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert injected.wait(90), "\n".join(lines[-30:])
        time.sleep(3.0)  # mid-fault, mid-load: step the harness's wall clock back an hour
        write_clock(clock, offset_spec(-3600))
        stepped_at = time.monotonic()
        rc = child.wait(150)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        reader.join(10)
    out = "\n".join(lines[-40:])
    ordeal_say(f"clock child ended {time.monotonic() - stepped_at:.0f}s after the step")
    assert rc == 0, out
    [result] = [json.loads(x[len("RESULT "):]) for x in lines if x.startswith("RESULT ")]
    run_dir = Path(result["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    ops = read_intact(run_dir / "history.jsonl")  # CRC-checked, indexes and time_ns ordered
    # The step really happened inside the child: walls go back about an hour.
    steps = [epoch(b.wall) - epoch(a.wall) for a, b in zip(ops, ops[1:])]
    assert min(steps) < -3500, f"no backward step in the child's wall times ({min(steps)})"
    assert epoch(summary["ended"]) < epoch(summary["started"]), summary["started"]
    # Durations come from the monotonic clock.
    assert 20 <= summary["duration_s"] <= 120, summary["duration_s"]
    pairs = pair_requests(ops)
    assert not negative_durations(ops), negative_durations(ops)[:5]
    assert not [d.error for _, d in pairs if "harness error" in str(d.error)]
    assert not summary["errors"] and summary["stopped"] is None, summary["errors"]
    crashed = [i for i in summary["invariants"] if "error" in (i.get("details") or {})]
    assert not crashed, crashed
    [window] = summary["faults"]
    assert window["injected"] and window["healed"] and not window["error"], window
    # The windows are right although the step fell inside the fault: the
    # second of latency shows in the fault phase and not outside it.
    phases = split_by_phase(run_dir / "history.jsonl", spec["after_heal_s"])
    steady, fault = phases["steady"], phases["fault"]
    assert fault.requests >= 10 and steady.requests >= 5, {k: v.brief() for k, v in
                                                           phases.items()}
    assert fault.p("e2e_ms") >= 1000 > steady.p("e2e_ms"), (fault.brief(), steady.brief())
    assert (run_dir / "report.html").stat().st_size > 0
