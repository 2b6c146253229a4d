"""The router dies and never returns (issue 11): the run notices within its
grace time, stops the load, heals the fault it holds, keeps its history whole
and ends with RouterGone naming the router, its exit status, its last log
lines and what to do. The kill comes from outside the fault machinery
(``os.kill`` on the router's pid), and nothing restarts it during the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.request

import pytest
from harness_checks import pair_requests, read_intact

from engines.vllm.nodes import SERVED_MODEL_NAME
from faults.factory import build_faults
from faults.ledger import Ledger
from faults.proxy.client import ProxyClient
from load.router_watch import RouterGone, RouterWatch, exit_status_text
from load.spec import WorkloadSpec
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint
from reports.run_dir import RunDir
from runs.run import OrdealRun, PlannedFault


def test_exit_status_text_names_the_signal():
    assert exit_status_text(-9) == "killed by SIGKILL (exit status -9)"
    assert exit_status_text(3) == "exited with status 3"
    assert "running" in exit_status_text(None)


def test_watch_sees_a_real_process_die_and_waits_out_its_grace(tmp_path, health_server_argv):
    """A real HTTP server process stands in for the router: while it serves
    the watch waits; killed, the watch reports it after the grace time, not
    before, and not while a fault is said to hold it down."""
    port = free_ports(1, "127.0.0.1")[0]
    proc = ManagedProcess("router", health_server_argv(port), dict(os.environ),
                          tmp_path / "router.log", "watch-test")
    node = LocalNode("router", "router", Endpoint("127.0.0.1", port), proc, "")
    proc.start()
    try:
        node.wait_ready(30)
        held = {"down": True}
        watch = RouterWatch(node, grace_s=1.5, interval_s=0.1,
                            expected_down=lambda: held["down"])

        async def scenario() -> tuple[float, str]:
            task = asyncio.create_task(watch.wait_gone())
            await asyncio.sleep(0.5)
            assert not task.done(), "the watch gave up on a router that serves"
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.sleep(2.5)  # longer than the grace, but a fault "holds" it down
            assert not task.done(), "a router down on purpose counted against its grace"
            held["down"] = False
            t0 = time.monotonic()
            message = await asyncio.wait_for(task, 10)
            return time.monotonic() - t0, message

        took, message = asyncio.run(scenario())
        # At least the grace (1.5 s, less a poll): the watch never gives up
        # early; at most the grace and a loaded machine's few seconds more.
        assert 1.4 <= took <= 1.5 + 5.0, took
        assert "killed by SIGKILL (exit status -9)" in message, message
        assert f"pid {proc.pid}" in message and "refuses connections" in message, message
        assert str(tmp_path / "router.log") in message and "what to do" in message, message
        assert "CHILDPID=" in message  # the last log lines are in it
    finally:
        proc.stop()


def test_watch_sees_a_dead_router_behind_a_port_that_still_accepts(tmp_path,
                                                                  health_server_argv):
    """A published container port (docker-proxy) keeps accepting after the
    router behind it died: the process state decides then."""
    port = free_ports(1, "127.0.0.1")[0]
    proxy = ManagedProcess("port-proxy", health_server_argv(port), dict(os.environ),
                           tmp_path / "proxy.log", "watch-test")
    router = ManagedProcess("router", [sys.executable, "-c", "import sys; sys.exit(3)"],
                            dict(os.environ), tmp_path / "router.log", "watch-test")
    node = LocalNode("router", "router", Endpoint("127.0.0.1", port), router, "")
    proxy.start()
    try:
        LocalNode("port-proxy", "router", node.endpoint, proxy, "").wait_ready(30)
        router.start()
        watch = RouterWatch(node, grace_s=0.5, interval_s=0.1)
        message = asyncio.run(asyncio.wait_for(watch.wait_gone(), 20))
        assert "its process: exited with status 3" in message, message
        assert "still accepts connections" in message, message
    finally:
        proxy.stop()
        router.stop()


def _complete(url: str) -> dict:
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "hello", "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_router_killed_for_good_stops_the_run_heals_and_says_why(ordeal_cluster, ordeal_say,
                                                                  tmp_path):
    cluster = ordeal_cluster
    router = cluster.router
    link = cluster.link("router-replica-0")
    proxy = ProxyClient(link.control)
    run = OrdealRun(RunDir.create(tmp_path, "router-gone"), "router-gone", cluster, ordeal_say)
    ledger = Ledger()
    [fault] = build_faults("network_latency", link.name, cluster, run.run_id, ledger,
                           random.Random(0), {"latency_ms": 30})
    grace = 5.0
    spec = WorkloadSpec(duration_s=120.0, rate=6.0, seed=11, max_tokens=(8, 16), timeout_s=20)
    killed: dict = {}

    def kill_router_once_the_fault_is_in() -> None:
        deadline = time.monotonic() + 60
        while not fault.active and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.0)  # requests flow through the router with the toxic in place
        killed["pid"] = router.pid
        killed["at"] = time.monotonic()
        os.kill(router.pid, signal.SIGKILL)  # from outside the fault machinery

    killer = threading.Thread(target=kill_router_once_the_fault_is_in, daemon=True)
    killer.start()
    try:
        with pytest.raises(RouterGone) as e:
            run.load(spec, faults=[PlannedFault(fault, after_s=2.0, hold_s=100.0)], max_s=150,
                     router_grace_s=grace)
        took = time.monotonic() - killed["at"]
        message = str(e.value)
        ordeal_say(f"router gone after {took:.1f}s: {message.splitlines()[0]}")
        summary = run.finish()
        killer.join(5)

        # Noticed after the grace time, and stopped soon after (not at the
        # fault's 100 s hold or the load's 120 s): in-flight requests fail fast.
        assert grace <= took <= grace + 25, took
        # A clear message: which router, its exit status, its log, what to do.
        assert (f"the router (router at {router.endpoint.url}, pid {killed['pid']}) is gone"
                in message), message
        assert "killed by SIGKILL (exit status -9)" in message, message
        assert str(router.process.log_path) in message and "    | " in message, message
        assert "\x1b[" not in message, "colour codes of the router's log in the message"
        assert "what to do" in message, message
        # Healed: no toxic left on the link, no ledger entry of the run.
        assert proxy.toxics(link.name) == []
        assert not fault.active
        assert not [x for x in ledger.pending()
                    if not isinstance(x, str) and x.run_id == run.run_id]
        # The stop is in the summary the way other stops are, and fails the verdict.
        assert summary["stopped"] == message
        assert message in summary["errors"] and summary["verdict"] != "pass", summary
        assert summary["duration_s"] and summary["duration_s"] < 100, summary["duration_s"]
        # The history is whole (CRC-checked chunks), every request has its
        # end, and nothing was sent after the stop was recorded.
        ops = read_intact(run.run_dir.history_path)
        pairs = pair_requests(ops)
        [stop] = [op for op in ops if op.f == "router_gone"]
        assert stop.value["exit_code"] == -9 and stop.value["pid"] == killed["pid"], stop
        assert not [inv for inv, _ in pairs if inv.index > stop.index]
        assert [o for o in ops if o.process == "nemesis" and o.f == "heal"
                and o.value.get("phase") == "end"], "the heal was not recorded"
        before = [done for inv, done in pairs if inv.time_ns < killed["at"] * 1e9 - 1e9]
        assert sum(d.type == "ok" for d in before) >= 5, "no traffic before the kill"
    finally:
        killer.join(30)
        fault.heal()  # idempotent; a no-op when the run healed it
        if not router.is_running():  # give the session its cluster back
            router.start()
            router.wait_ready(60)
    answer = _complete(cluster.entrypoint.url)  # the cluster serves again
    assert answer["choices"][0]["text"] is not None


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_router_held_down_by_our_own_fault_is_not_gone(ordeal_cluster, ordeal_say, tmp_path):
    """process_kill on the router through the run's nemesis keeps it down
    far longer than the grace time; that is a fault under test, not a
    router gone for good: the run goes on and its heal restarts it."""
    cluster = ordeal_cluster
    run = OrdealRun(RunDir.create(tmp_path, "router-kill"), "router-kill", cluster, ordeal_say)
    [kill] = build_faults("process_kill", "router", cluster, run.run_id, Ledger(),
                          random.Random(0), {"ready_timeout_s": 60})
    spec = WorkloadSpec(duration_s=8.0, rate=4.0, seed=12, max_tokens=(8, 16), timeout_s=20)
    try:
        run.load(spec, faults=[PlannedFault(kill, after_s=2.0, hold_s=6.0)], after_heal_s=3.0,
                 max_s=120, router_grace_s=2.0)
    finally:
        if not cluster.router.is_running():
            cluster.router.start()
            cluster.router.wait_ready(60)
    summary = run.finish()
    assert run.stop_reason is None and summary["stopped"] is None, summary["stopped"]
    [window] = summary["faults"]
    assert window["healed"] and window["heal_result"]["restarted"] is True, window
    ops = read_intact(run.run_dir.history_path)
    pair_requests(ops)
    assert not [op for op in ops if op.f == "router_gone"]
    assert _complete(cluster.entrypoint.url)["choices"]
