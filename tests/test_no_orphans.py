"""no_orphans: after a kill, no process of the dead node lives on past the
bound. The checker over planted heal records (the shape
faults/process_kill.py writes), and the kill's orphan check on real
processes: a labelled group whose child leaves it (setsid) and survives the
group's SIGKILL is found, recorded and ended by pid; the real vLLM replica
is in suites/faults/test_process_kill.py (scopes api_server, engine_core)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest

from faults.base import FaultError
from faults.ledger import Ledger
from faults.node_processes import (
    SCOPES,
    is_same,
    node_members,
    proc_names,
    scope_pids,
    worker_ranks,
)
from faults.process_kill import ProcessKill
from faults.process_pause import ProcessPause
from invariants import DEFAULT_CHECKERS, NoOrphans, RunContext
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal import procfs
from ordeal.history.ops import NEMESIS, Op
from ordeal.topology import Endpoint

CTX = RunContext(run_id="t")


def history(*heals):
    ops, t = [], 0
    for heal in heals:
        kind = heal.pop("kind", "process_kill")
        v = {"kind": kind, "target": "replica-1"}
        for f, phase, extra in (("inject", "begin", {}), ("inject", "end", {}),
                                ("heal", "begin", {}), ("heal", "end", heal)):
            t += 1
            ops.append(Op(len(ops), t * 10**9, "2026-12-02T00:00:00.000Z", "info", NEMESIS, f,
                          {**v, **extra, "phase": phase}))
    return ops


def test_a_kill_whose_heal_found_nothing_alive_is_valid():
    r = NoOrphans().check(history({"scope": "node", "orphan_bound_s": 10, "orphans": []}), CTX)
    assert r.valid is True and r.details["checked"] == 1 and r.details["orphans"] == 0
    assert NoOrphans in DEFAULT_CHECKERS


def test_an_orphan_is_a_violation_with_its_pid_name_and_age():
    orphan = {"pid": 4242, "names": "python -B -c resource_tracker", "alive_after_kill_s": 12.1}
    r = NoOrphans().check(history(
        {"scope": "node", "orphan_bound_s": 10, "orphans": []},
        {"scope": "api_server", "orphan_bound_s": 10, "orphans": [orphan]}), CTX)
    assert r.valid is False
    assert r.details["kills"] == 2 and r.details["orphans"] == 1
    assert r.details["violations_by_window"] == {"process_kill@replica-1#2": 1}
    assert r.details["kills_by_scope"] == {"node": 1, "api_server": 1}
    [ex] = r.counterexamples
    assert "pid 4242 (python -B -c resource_tracker) of replica-1 still ran 12.1s" in \
        ex["problem"]


def test_heals_without_an_orphan_check_are_counted_not_judged():
    r = NoOrphans().check(history({"restarted": True}, {"kind": "process_pause"}), CTX)
    assert r.valid == "unknown" and r.details["kills"] == 1 and r.details["not_checked"] == 1
    assert "no orphan check" in r.details["why"]
    checked = {"scope": "node", "orphan_bound_s": 10, "orphans": []}
    both = NoOrphans().check(history({"restarted": True}, checked), CTX)
    assert both.valid == "unknown"  # one kill judged does not speak for the other
    assert NoOrphans().check(history(dict(checked)), CTX).valid is True


# -- the kill's orphan check, on real processes ------------------------------------

ESCAPER = r"""
import os, subprocess, sys, time, http.server, threading
port = int(sys.argv[1])
# A child that leaves the group (as a worker that calls setsid would): a
# group SIGKILL misses it.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                 start_new_session=True)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


@pytest.fixture
def escaping_node(tmp_path):
    port = free_ports(1)[0]
    proc = ManagedProcess("escaper", [sys.executable, "-c", ESCAPER, str(port)],
                          dict(os.environ), tmp_path / "escaper.log", "orphan-test")
    node = LocalNode("escaper", "replica", Endpoint("127.0.0.1", port), proc, hint="")
    node.start()
    try:
        node.wait_ready(30)
        yield node
    finally:
        left = node_members(node) if node.is_running() else []
        node.stop(grace=2)
        for m in left:  # a failed test's escaped child: ours, by pid
            if is_same(m):
                os.kill(m.pid, signal.SIGKILL)


def test_a_process_outside_the_group_that_outlives_the_kill_is_found_and_ended(
        escaping_node, tmp_path):
    members = node_members(escaping_node)
    outside = [m for m in members if m.pgid != escaping_node.pid]
    assert len(outside) == 1, members  # found by its labels, not by its group
    fault = ProcessKill(escaping_node, "orphan-test", Ledger(tmp_path / "ledger"),
                        restart=False, orphan_bound_s=1.0)
    fault.inject()
    t0 = time.monotonic()
    healed = fault.heal()
    assert healed["effect"]["effective"] is True
    [orphan] = healed["orphans"]
    assert orphan["pid"] == outside[0].pid and orphan["alive_after_kill_s"] >= 1.0
    assert healed["orphans_ended"] == [outside[0].pid]
    assert time.monotonic() - t0 < 30
    assert procfs.start_time(outside[0].pid) is None  # gone (or a zombie to be reaped)


# A child that stays in the group with no environment of its own, as vLLM's
# EngineCore (its rename overwrites its environment block): its label is
# read from its leader, and after the leader's SIGKILL from nowhere.
BLANK = r"""
import http.server, subprocess, sys
port = int(sys.argv[1])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={})
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


@contextlib.contextmanager
def blank_node(tmp_path, name="blank"):
    """A node running BLANK, ready, with its one child; whatever of it is
    left at the end is ended, by pid and start time."""
    port = free_ports(1)[0]
    proc = ManagedProcess("blank", [sys.executable, "-c", BLANK, str(port)],
                          dict(os.environ), tmp_path / "blank.log", "orphan-test")
    node = LocalNode(name, "replica", Endpoint("127.0.0.1", port), proc, hint="")
    node.start()
    members = []
    try:
        node.wait_ready(30)
        members = node_members(node)
        [child] = [m for m in members if m.pid != node.pid]
        yield node, child
    finally:
        node.stop(grace=2)
        for m in members:  # a failed test's child: ours, by pid and start time
            if is_same(m):
                os.kill(m.pid, signal.SIGKILL)


def test_a_member_without_a_label_of_its_own_that_outlives_its_leader_is_an_orphan(tmp_path):
    """CI, 2026-12-03: an EngineCore outlived its SIGKILLed API server for 46
    minutes; the orphan check read its label as None once the leader was
    gone, took it for another process, and neither it nor any teardown
    ended it."""
    with blank_node(tmp_path) as (node, child):
        assert child.pgid == node.pid and child.label == "orphan-test", child
        fault = ProcessKill(node, "orphan-test", Ledger(tmp_path / "ledger"), restart=False,
                            scope="api_server", orphan_bound_s=1.0)
        fault.inject()
        healed = fault.heal()
        assert [o["pid"] for o in healed["orphans"]] == [child.pid], healed
        assert healed["orphans_ended"] == [child.pid]
        assert not is_same(child)


def test_scopes_are_checked_before_anything_changes(escaping_node, tmp_path):
    with pytest.raises(FaultError, match="scope 'everything' is unknown"):
        ProcessKill(escaping_node, "t", Ledger(tmp_path / "l"), scope="everything")
    with pytest.raises(FaultError, match="matches no process of escaper; its members are"):
        scope_pids(escaping_node, "engine_core", "process_kill")
    assert scope_pids(escaping_node, "api_server", "process_kill") == [escaping_node.pid]
    assert set(SCOPES) == {"node", "api_server", "engine_core", "rank:N"}
    for bad in ("rank:", "rank:x", "rank:-1", "rank:N", "rank: 1"):
        with pytest.raises(FaultError, match=f"scope {bad!r} is unknown.*rank:N"):
            ProcessPause(escaping_node, "t", Ledger(tmp_path / "l"), scope=bad)
    # A node with no vLLM worker: rank 0 matches nothing, and says what is there.
    with pytest.raises(FaultError, match="scope 'rank:0' matches no process of escaper"):
        scope_pids(escaping_node, "rank:0", "process_pause")
    assert escaping_node.is_running()


@pytest.mark.parametrize("names, ranks", [
    ("VLLM::Worker VLLM::Worker", {0}),                      # no tensor parallelism
    ("VLLM::Worker_TP VLLM::Worker_TP1", {1}),               # comm cut at 15 bytes
    ("VLLM::Worker_TP VLLM::Worker_TP0_EP0", {0}),
    ("VLLM::Worker_PP VLLM::Worker_PP1_TP3", {3}),
    ("VLLM::Worker_DP VLLM::Worker_DP1", {0}),               # data parallel only: TP rank 0
    ("myco::Worker_TP2 myco::Worker_TP2", {2}),              # VLLM_PROCESS_NAME_PREFIX
    ("VLLM::EngineCor VLLM::EngineCore", set()),
    ("python3 python3 -m vllm.entrypoints.openai.api_server --model m", set()),
    ("VLLM::Workers VLLM::Worker_TPX", set()),
    ("", set()),
])
def test_a_workers_tensor_parallel_rank_is_read_from_vllms_process_title(names, ranks):
    """vLLM's multiprocessing executor titles each worker (setproctitle):
    rank:N picks the ``_TP<N>`` one, or the plain "Worker" as rank 0."""
    assert worker_ranks(names) == ranks


def test_windows_itemised_are_bounded_and_every_orphan_is_counted():
    from invariants.no_orphans import MAX_ORPHAN_ROWS
    orphan = {"pid": 1, "names": "x", "alive_after_kill_s": 11.0}
    heals = [{"scope": "node", "orphan_bound_s": 10, "orphans": [dict(orphan)]}
             for _ in range(2 * MAX_ORPHAN_ROWS)]
    r = NoOrphans().check(history(*heals), CTX)
    assert r.details["orphans"] == 2 * MAX_ORPHAN_ROWS
    assert len(r.details["violations_by_window"]) == MAX_ORPHAN_ROWS
    assert len(r.counterexamples) == 5


# -- a kill nobody announced: the monitor's samples -----------------------------------


def sample(i, t_s, survivors, node="replica-1", pid=100, exit_code=-9):
    from ordeal.history.ops import MONITOR
    return Op(i, int(t_s * 1e9), "w", "info", MONITOR, "sample",
              {"node": node, "pid": pid, "health": None, "exit_code": exit_code,
               "survivors": survivors}, "/health: ConnectionRefusedError")


def test_an_unannounced_orphan_past_the_bound_fails_and_no_known_finding_covers_it():
    from invariants.known import embedded_file, read_known_findings
    engine_core = [[4242, "VLLM::EngineCore"]]
    within = NoOrphans().check([sample(0, 1, engine_core), sample(1, 9, engine_core)], CTX)
    assert within.valid is True  # 8 s after the exit: inside the 10 s bound
    past = NoOrphans().check([sample(0, 1, engine_core), sample(1, 12, engine_core),
                              sample(2, 14, engine_core)], CTX)
    assert past.valid is False and past.details["unannounced_orphans"] == 1  # counted once
    [ex] = past.counterexamples
    assert ex["index"] == 1 and ex["window"] is None
    assert "pid 4242 (VLLM::EngineCore) of replica-1 still ran 11.0s after its main " \
           "process ended (exit -9) with no fault announced" in ex["problem"]
    gone = NoOrphans().check([sample(0, 1, engine_core), sample(1, 12, [])], CTX)
    assert gone.valid is True
    # The shipped file's no_orphans finding (announced api_server kills) does not cover it.
    known = read_known_findings(embedded_file(["vllm-0.32.0-x", "vllm-router-0.1.17"]))
    inv = past.to_dict()
    known.apply([inv], [])
    assert not inv.get("known")


def test_survivors_inside_an_announced_kill_are_left_to_its_heal():
    ops = history({"scope": "api_server", "orphan_bound_s": 10, "orphans": []})
    heal_end = ops.pop()  # the window stays open while the samples come
    ops += [sample(len(ops), 5, [[4242, "VLLM::EngineCore"]]),
            sample(len(ops) + 1, 20, [[4242, "VLLM::EngineCore"]])]
    heal_end = Op(len(ops), 21 * 10**9, heal_end.wall, "info", NEMESIS, "heal", heal_end.value)
    r = NoOrphans().check(ops + [heal_end], CTX)
    assert r.valid is True and r.details["unannounced_orphans"] == 0, r.details


def test_the_monitor_names_what_of_a_dead_node_s_group_runs_on(tmp_path):
    """Real processes: the leader of a node's group SIGKILLed behind the
    harness's back (no fault), its child (EngineCore's shape: same group,
    no environment of its own) lives on; the monitor's sample says the node
    exited and names the child, and no_orphans fails on it."""
    from load.monitor import sample_node
    from ordeal.history.ops import MONITOR
    with blank_node(tmp_path, "replica-1") as (node, child):
        alive = sample_node(node)
        assert alive["health"] == 200 and "survivors" not in alive
        os.kill(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while node.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = sample_node(node)
        assert dead["exit_code"] == -signal.SIGKILL
        assert [pid for pid, _ in dead["survivors"]] == [child.pid], dead
        ops = [Op(i, int(t * 1e9), "w", "info", MONITOR, "sample", dead, dead.get("error"))
               for i, t in enumerate((1, 12))]
        r = NoOrphans().check(ops, CTX)
        assert r.valid is False and r.counterexamples[0]["pid"] == child.pid


#: BLANK's children, titled: their command lines end with vLLM's process
#: titles (what setproctitle leaves in /proc/PID/cmdline); the leader's not.
TITLED = BLANK.replace(
    'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={})',
    'import os\nfor title in os.environ["TITLES"].split(","):\n'
    '    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", title])')
assert TITLED != BLANK


@pytest.mark.parametrize("titles, picks", [
    (("VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1"),
     {"rank:0": "VLLM::Worker_TP0", "rank:1": "VLLM::Worker_TP1", "rank:2": None}),
    # One GPU, no tensor parallelism: no worker process; rank 0 runs in EngineCore.
    (("VLLM::EngineCore",), {"rank:0": "VLLM::EngineCore", "rank:1": None}),
])
def test_a_rank_scope_picks_that_ranks_worker_or_the_engine_that_runs_rank_0(
        tmp_path, titles, picks):
    port = free_ports(1)[0]
    proc = ManagedProcess("titled", [sys.executable, "-c", TITLED, str(port)],
                          {**os.environ, "TITLES": ",".join(titles)}, tmp_path / "titled.log",
                          "orphan-test")
    node = LocalNode("titled", "replica", Endpoint("127.0.0.1", port), proc, hint="")
    node.start()
    members = []
    try:
        node.wait_ready(30)
        deadline = time.monotonic() + 10
        while len(node.pids()) < 1 + len(titles) and time.monotonic() < deadline:
            time.sleep(0.05)
        members = node_members(node)
        by_title = {t: [p for p in node.pids() if proc_names(p).endswith(t)] for t in titles}
        assert all(len(v) == 1 for v in by_title.values()), by_title
        for scope, title in picks.items():
            if title is None:
                with pytest.raises(FaultError, match=f"scope '{scope}' matches no process"):
                    scope_pids(node, scope, "process_pause")
            else:
                assert scope_pids(node, scope, "process_pause") == by_title[title], scope
    finally:
        node.stop(grace=2)
        for m in members:
            if is_same(m):
                os.kill(m.pid, signal.SIGKILL)
