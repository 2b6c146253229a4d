"""The load from several processes (``--load-workers``, load/workers.py).

Against the session cluster (real vLLM replicas behind vllm-router): two
worker processes share the seeded plan and the parent alone writes the one
history. The shares are checked against the plan itself (``plan_requests``,
independent of the workers), every request against the replicas' own
served journals, and a worker SIGKILLed mid-run must leave its requests in
flight recorded as ``info`` with why while the other worker goes on.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from faults import iptables
from load.monitor import node_journal
from load.plan import plan_requests
from load.spec import WorkloadSpec
from load.workers import (
    ProcessHandle,
    SocketWorkers,
    check_workers,
    connect_and_run,
    run_in_workers,
)
from load.workload import WorkloadRunner
from ordeal.config import ConfigError
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from ordeal.journal import JournalTail

REPO = Path(__file__).resolve().parent.parent


def test_the_shares_of_n_workers_are_the_plan_once():
    spec = WorkloadSpec(duration_s=5, rate=20, seed=3)
    plan = [r.seq for r in plan_requests(spec, limit_s=5)]
    for n in (1, 2, 3, 5):
        got = []
        for i in range(n):
            runner = WorkloadRunner(spec, "http://127.0.0.1:9", None, share=(i, n))  # type: ignore[arg-type]
            got += [r.seq for r in plan_requests(spec, limit_s=5) if runner._mine(r)]
        assert sorted(got) == plan, n


@pytest.mark.parametrize("bad", [0, -1, 257, 1.5, True, "2"])
def test_a_bad_worker_count_is_refused_with_what_to_give(bad):
    with pytest.raises(ConfigError, match="--load-workers .*whole number from 1"):
        check_workers(bad)


def test_bad_load_workers_stop_pytest_before_any_cluster(tmp_path):
    for args, message in ((["--load-workers", "0"], "--load-workers 0: give a whole number"),
                          (["--engine", "triton", "--load-workers", "2"],
                           "--load-workers 2: the load workers speak the OpenAI API only")):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "suites/test_smoke.py", "-m", "smoke",
             "-p", "no:cacheprovider", "--runs-dir", str(tmp_path / "runs"), *args],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "ORDEAL_STATE_DIR": str(tmp_path / "state")})
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and message in out, out[-2000:]
        assert "starting 2 vllm replica" not in out and "starting tritonserver" not in out, \
            out[-2000:]


def _ops(path: Path) -> list:
    problems: list[str] = []
    ops = list(read_history(path, on_error=problems.append))
    assert not problems, problems
    assert [o.index for o in ops] == list(range(len(ops)))
    return ops


@pytest.mark.cluster
def test_two_workers_send_the_plan_once_and_the_replicas_saw_each_request(ordeal_cluster,
                                                                           tmp_path):
    h = History(tmp_path / "h.jsonl")
    spec = WorkloadSpec(duration_s=8, rate=10, seed=11, max_tokens=(4, 12))
    tails = {n.name: JournalTail(node_journal(n)) for n in ordeal_cluster.replicas()}
    said: list[str] = []
    runner = WorkloadRunner(spec, ordeal_cluster.entrypoint.url, h, progress=said.append)
    asyncio.run(run_in_workers(runner, 2))
    h.close()
    ops = _ops(tmp_path / "h.jsonl")
    assert any("2 worker processes" in s for s in said), said
    invokes = [o for o in ops if o.type == "invoke"]
    # The plan's requests up to the stop, each once, from both workers: the
    # one-process plan (plan_requests), not the workers' own account.
    seqs = sorted(o.value["seq"] for o in invokes)
    plan = [r.seq for r in plan_requests(spec, limit_s=spec.duration_s)]
    assert seqs == plan and len(plan) >= 0.8 * spec.rate * spec.duration_s, (seqs, plan)
    by_worker = Counter(o.value["worker"] for o in invokes)
    assert set(by_worker) == {0, 1}, by_worker
    assert all(o.value["seq"] % 2 == o.value["worker"] for o in invokes)
    # Every invoke has one completion, after it, and each was served.
    open_: dict = {}
    done = Counter()
    for o in ops:
        if o.type == "invoke":
            assert o.process not in open_
            open_[o.process] = o
        else:
            done[open_.pop(o.process).value["request_id"]] += 1
            assert o.type == "ok", o
    assert not open_ and set(done.values()) == {1}
    # The replicas' own journals: each request id served once, by the node
    # the client says.
    served: dict[str, list[str]] = {}
    for name, tail in tails.items():
        entries, _begun, bad = tail.read_new()
        assert bad == []
        for rid, status, complete in entries:
            assert (status, complete) == (200, True)
            served.setdefault(rid, []).append(name)
    rids = {o.process: o.value["request_id"] for o in invokes}
    assert served == {rids[o.process]: [o.value["node"]] for o in ops if o.type == "ok"}


@pytest.mark.cluster
def test_a_worker_killed_mid_run_leaves_its_requests_as_info_and_the_other_goes_on(
        ordeal_cluster, tmp_path):
    h = History(tmp_path / "h.jsonl")
    # Long answers, so the killed worker has requests in flight.
    spec = WorkloadSpec(duration_s=10, rate=6, seed=12, max_tokens=(150, 200), timeout_s=60)
    said: list[str] = []
    runner = WorkloadRunner(spec, ordeal_cluster.entrypoint.url, h, progress=said.append)

    async def main() -> None:
        load = asyncio.create_task(run_in_workers(runner, 2))
        while not any("worker processes (pids" in s for s in said):
            await asyncio.sleep(0.1)
        line = next(s for s in said if "worker processes (pids" in s)
        victim = int(line.split("(pids ", 1)[1].split(",")[0])
        while runner.in_flight < 2:  # its share has requests out
            await asyncio.sleep(0.1)
        await asyncio.sleep(3)
        os.kill(victim, signal.SIGKILL)  # our own child, by its pid
        await load

    asyncio.run(main())
    h.close()
    ops = _ops(tmp_path / "h.jsonl")
    assert any("load worker 0" in s and ("died" in s or "exited" in s) for s in said), said
    assert runner.worker_errors and "load worker 0" in runner.worker_errors[0]
    invokes = {o.process: o for o in ops if o.type == "invoke"}
    ends = {o.process: o for o in ops if o.type != "invoke"}
    assert set(invokes) == set(ends), "every invoke ends, the killed worker's too"
    cut = [o for o in ends.values() if o.type == "info" and "load worker 0" in (o.error or "")]
    assert cut and all(invokes[o.process].value["worker"] == 0 for o in cut), cut
    # Worker 1 went on to the end of the load: it sent requests after the kill.
    kill_index = min(o.index for o in cut)
    assert any(o.value["worker"] == 1 and o.index > kill_index for o in invokes.values())
    assert all(o.type == "ok" for o in ends.values() if invokes[o.process].value["worker"] == 1)


def test_an_encoded_value_is_written_as_append_writes_it(tmp_path):
    """A worker's op (value encoded in the worker) and the same op appended
    whole read back alike, CRC checked, in one file."""
    import json as _json

    h = History(tmp_path / "h.jsonl")
    value = {"seq": 3, "text": "é \u2028 \"q\"", "itl_ms": [1.5, 2.0], "stream": {"chunks": []}}
    h.append("ok", 7, "chat", value, None)
    h.append_encoded("ok", 7, "chat", _json.dumps(value, separators=(",", ":"),
                                                   ensure_ascii=False), None)
    h.append_encoded("info", 8, "chat", '{"seq":4}', "cut: reset")
    h.close()
    lines = [ln for ln in (tmp_path / "h.jsonl").read_text().splitlines() if '"index"' in ln]
    strip = [ln.split(',"type"', 1)[1] for ln in lines]  # past index, time, wall
    assert strip[0] == strip[1]
    ops = _ops(tmp_path / "h.jsonl")
    assert ops[0].value == ops[1].value == value and ops[1].index == 1
    assert (ops[2].type, ops[2].error, ops[2].value) == ("info", "cut: reset", {"seq": 4})


@pytest.mark.cluster
@pytest.mark.needs("iptables (root, CAP_NET_ADMIN)", iptables.unavailable_reason)
def test_a_run_with_load_workers_goes_on_past_its_duration_until_the_heal(ordeal_cluster,
                                                                         ordeal_say, tmp_path):
    """OrdealRun.load with --load-workers 2: the workers go on past the
    load's duration while the fault has not healed (the parent pushes the
    horizon), then stop; the summary records the setting."""
    from faults.ledger import Ledger
    from faults.network_partition import NetworkPartition
    from nodes.ports import free_ports
    from ordeal.topology import Endpoint
    from reports.run_dir import RunDir
    from runs.run import OrdealRun, PlannedFault

    class AtAnUnusedPort:  # a partition nobody feels (tests/test_fault_effective_run.py)
        def __init__(self, node, port: int):
            self.name, self.role, self.node = "unused-port", "replica", node
            self.endpoint = Endpoint("127.0.0.1", port)

        def is_running(self) -> bool:
            return self.node.is_running()

    run = OrdealRun(RunDir.create(tmp_path, "workers"), "workers", ordeal_cluster, ordeal_say)
    run.load_workers = 2
    run.load_loop = "uvloop"  # the workers' loop too (load/event_loop.py)
    fault = NetworkPartition(AtAnUnusedPort(ordeal_cluster.replicas()[0], free_ports(1)[0]),
                             run.run_id, Ledger())
    run.load(WorkloadSpec(duration_s=4.0, rate=6.0, seed=9, max_tokens=(4, 8)),
             faults=[PlannedFault(fault, after_s=1.0, hold_s=5.0)], after_heal_s=2.0)
    summary = run.finish()
    assert summary["load_workers"] == 2 and not summary["errors"], summary["errors"]
    assert summary["load_loop"].startswith("uvloop "), summary["load_loop"]
    ops = _ops(run.run_dir.history_path)
    heal = next(o for o in ops if o.process == "nemesis" and o.f == "heal"
                and o.value.get("phase") == "end")
    invokes = [o for o in ops if o.type == "invoke"]
    assert {o.value["worker"] for o in invokes} == {0, 1}
    # The heal came at ~6 s, past the 4 s duration: requests went on after it,
    # for about its 2 s after-heal time, and then stopped.
    after = [o for o in invokes if o.index > heal.index]
    assert len(after) >= 4, len(after)
    # Judged on when the last request was due, not when a loaded machine
    # got round to sending it (its lag): the plan stops at the after-heal time.
    last = invokes[-1]
    span_s = (last.time_ns - heal.time_ns) / 1e9 - last.value.get("lag_ms", 0.0) / 1000
    assert span_s < 2.0 + 2.0, (span_s, last.value.get("lag_ms"))
    assert all(o.type == "ok" for o in ops if o.type in ("ok", "fail", "info")
               and o.process not in ("nemesis", "monitor"))


class _SocketProcesses:
    """A launcher whose workers dial back over TCP (load.workers.SocketWorkers)
    the way a Ray actor on another node does (clusters/ray_actors.py), here as
    local processes: the transport without Ray."""

    what = "socket workers"

    def __init__(self) -> None:
        self.listener: SocketWorkers | None = None

    def launch(self, jobs):
        self.listener = SocketWorkers()
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=connect_and_run, daemon=True,
                             args=(self.listener.address, self.listener.key, job))
                 for job in jobs]
        for proc in procs:
            proc.start()
        conns = self.listener.accept(len(jobs), 120)
        out = []
        for proc, job in zip(procs, jobs):
            out.append((ProcessHandle(proc, conns[job.index][1]), conns[job.index][0]))
        return out

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


def test_a_socket_refuses_a_worker_without_the_key_and_says_who_never_came():
    import threading

    listener = SocketWorkers()
    refused: list[BaseException] = []

    def intruder() -> None:
        try:
            Client(listener.address, authkey=b"not the key")
        except BaseException as e:  # noqa: BLE001 - what it got is the point
            refused.append(e)

    t = threading.Thread(target=intruder, daemon=True)
    try:
        t.start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"1 of 1 load workers did not connect .* "
                                                r"within 2s \(can they reach this host\?\)"):
            listener.accept(1, 2.0)
        assert time.monotonic() - t0 < 6
    finally:
        listener.close()
        t.join(5)
    assert refused and isinstance(refused[0], multiprocessing.AuthenticationError), refused


def test_a_dialer_that_says_nothing_does_not_hold_the_start_past_its_deadline():
    """Something on the listener's port that connects and never answers the
    challenge: ``accept`` gives up at its deadline, as for no dialer at all."""
    import threading

    listener = SocketWorkers()
    silent = socket.create_connection(listener.address)
    raised: list[BaseException] = []

    def accept() -> None:
        try:
            listener.accept(1, 2.0)
        except BaseException as e:  # noqa: BLE001 - what it raised is the point
            raised.append(e)

    t = threading.Thread(target=accept, daemon=True)
    try:
        t.start()
        t.join(15)
        assert not t.is_alive(), "accept() still blocked on a silent dialer 15 s after a 2 s deadline"
    finally:
        silent.close()
        listener.close()
        t.join(5)
    assert raised and isinstance(raised[0], RuntimeError), raised
    assert "1 of 1 load workers did not connect" in str(raised[0]), raised


@pytest.mark.cluster
def test_workers_over_a_socket_send_the_plan_once_with_times_in_their_own_clock(
        ordeal_cluster, tmp_path):
    """The control (start, horizon, stop) crosses the connection as plan
    seconds, so a worker behind a socket runs the same share as a child."""
    h = History(tmp_path / "h.jsonl")
    spec = WorkloadSpec(duration_s=5, rate=8, seed=13, max_tokens=(4, 8))
    said: list[str] = []
    runner = WorkloadRunner(spec, ordeal_cluster.entrypoint.url, h, progress=said.append)
    launcher = _SocketProcesses()
    asyncio.run(run_in_workers(runner, 2, launcher=launcher))
    h.close()
    ops = _ops(tmp_path / "h.jsonl")
    assert any("2 socket workers (pids" in s for s in said), said
    invokes = [o for o in ops if o.type == "invoke"]
    assert sorted(o.value["seq"] for o in invokes) == [
        r.seq for r in plan_requests(spec, limit_s=spec.duration_s)]
    assert {o.value["worker"] for o in invokes} == {0, 1}
    assert all(o.type == "ok" for o in ops if o.type != "invoke"), ops[-1]
    # Sent on the plan's schedule: no request went out before it was due.
    t0 = runner.t0 * 1e9
    plan = {r.seq: r.at_s for r in plan_requests(spec, limit_s=spec.duration_s)}
    early = [o.value["seq"] for o in invokes if o.time_ns < t0 + plan[o.value["seq"]] * 1e9 - 5e6]
    assert early == [], early
    late = max(o.value.get("lag_ms", 0.0) for o in invokes)  # from due, the worker's own
    assert late < 1000, late
