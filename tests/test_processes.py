"""Process handling against real processes: groups, labels, teardown,
reaping after a crashed harness, and readiness waits that explain."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import pids_alive
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess, group_members
from ordeal.ownership import reap_leftovers
from ordeal.topology import Endpoint, NodeNotReady


def node(tmp_path, argv_for_port, name="n0", cluster_id="cluster-a"):
    port = free_ports(1)[0]
    argv = argv_for_port(port) if callable(argv_for_port) else argv_for_port
    proc = ManagedProcess(name, argv, dict(os.environ), tmp_path / f"{name}.log", cluster_id)
    return LocalNode(name, "replica", Endpoint("127.0.0.1", port), proc, hint="try again")


def child_pid(log, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = log.exists() and re.search(r"^CHILDPID=(\d+)$", log.read_text(), re.M)
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no CHILDPID line in {log}")


def test_stop_ends_the_whole_group_and_nothing_else(tmp_path, health_server_argv):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    n = node(tmp_path, health_server_argv)
    n.start()
    try:
        n.wait_ready(15)
        child = child_pid(tmp_path / "n0.log")
        members = group_members(n.pid)
        assert n.pid in members and child in members
        env = open(f"/proc/{n.pid}/environ", "rb").read()
        assert b"ORDEAL_CLUSTER_ID=cluster-a" in env and b"ORDEAL_NODE=n0" in env  # the label
    finally:
        n.stop(grace=5)
    assert pids_alive([n.pid, child]) == []
    assert bystander.poll() is None  # not ours to touch
    bystander.kill()
    bystander.wait()


def test_wait_ready_timeout_explains_itself(tmp_path, health_server_argv):
    n = node(tmp_path, lambda port: health_server_argv(port, delay=60))
    n.start()
    try:
        with pytest.raises(NodeNotReady) as err:
            n.wait_ready(1.5)
        msg = str(err.value)
        assert "did not answer 200 within 2s" in msg
        assert "/health" in msg and "ConnectionRefusedError" in msg
        assert "process: running" in msg and "| CHILDPID=" in msg and "hint: try again" in msg
    finally:
        n.stop(grace=2)


def test_a_node_that_exits_fails_the_wait_at_once(tmp_path):
    n = node(tmp_path, [sys.executable, "-c", "import sys; print('bad model dir'); sys.exit(3)"])
    n.start()
    t0 = time.monotonic()
    with pytest.raises(NodeNotReady, match="exited with code 3") as err:
        n.wait_ready(60)
    assert time.monotonic() - t0 < 10
    assert "bad model dir" in str(err.value)
    n.stop()


def test_leftovers_of_a_crashed_harness_are_reaped_by_id(tmp_path, health_server_argv):
    # A harness that starts a node and is then SIGKILLed, leaving it running.
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(os.getcwd())!r})
        from nodes.process import ManagedProcess
        p = ManagedProcess("orphan", {health_server_argv(free_ports(1)[0])!r}, dict(os.environ),
                           __import__("pathlib").Path({str(tmp_path / 'orphan.log')!r}), "crashed-cluster")
        p.start()
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               env=os.environ)
    try:
        leader = int(harness.stdout.readline())
        child = child_pid(tmp_path / "orphan.log")
        harness.kill()
        harness.wait()
        assert pids_alive([leader, child]) == [leader, child]  # the leak
        lines = reap_leftovers(current_cluster="this-cluster")
        assert any("orphan" in line and "crashed-cluster" in line for line in lines), lines
        # Gone when it returns, not merely signalled: heal-all runs right
        # after it and must not reach a process still dying.
        assert pids_alive([leader, child]) == []
        assert reap_leftovers(current_cluster="this-cluster") == []  # records are gone too
    finally:
        harness.kill()
        reap_leftovers(current_cluster="this-cluster")


SIGTERM_SUITE = """
import os, sys, time
from pathlib import Path
import pytest
from nodes.process import ManagedProcess

@pytest.fixture
def server():
    p = ManagedProcess("svc", [sys.executable, "-c", "import time; time.sleep(600)"],
                       dict(os.environ), Path(os.environ["LOGDIR"]) / "svc.log", "sigterm-run")
    p.start()
    print("PID", p.pid, flush=True)
    try:
        yield p
    finally:
        p.stop(grace=2)
        print("STOPPED", flush=True)

def test_hangs(server):
    time.sleep(600)
"""


def test_sigterm_to_pytest_still_tears_down(tmp_path):
    (tmp_path / "test_inner.py").write_text(SIGTERM_SUITE)
    (tmp_path / "conftest.py").write_text("pytest_plugins = ['fixtures.plugin']\n")
    env = {**os.environ, "LOGDIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = None
    for line in p.stdout:
        m = re.search(r"\bPID (\d+)", line)
        if m:
            pid = int(m.group(1))
            break
    assert pid and pids_alive([pid]) == [pid]
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out = p.stdout.read()
    p.wait(timeout=30)
    assert "STOPPED" in out, out
    assert pids_alive([pid]) == []


RENAMING_HARNESS = """
import os, sys, time
from pathlib import Path
from nodes.process import ManagedProcess
# The node's child drops its environment (as vLLM's renamed EngineCore seems
# to, to /proc readers): only its process group says it is ours.
argv = [sys.executable, "-c", "import subprocess, time; "
        "subprocess.Popen(['env', '-i', 'sleep', '600']); time.sleep(600)"]
p = ManagedProcess("renamer", argv, dict(os.environ), Path(sys.argv[1]), "crashed-cluster-2")
p.start()
print(p.pid, flush=True)
time.sleep(600)
"""


def test_reap_ends_unlabelled_group_members_but_spares_a_live_harness(tmp_path):
    harness = subprocess.Popen([sys.executable, "-c", RENAMING_HARNESS, str(tmp_path / "r.log")],
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        leader = int(harness.stdout.readline())
        deadline = time.monotonic() + 10
        while len(group_members(leader)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = group_members(leader)
        assert len(members) == 2, members
        # Its harness still runs: not a leftover, whatever the cluster id says.
        assert reap_leftovers(current_cluster="this-cluster") == []
        assert pids_alive(members) == members
        harness.kill()
        harness.wait()
        lines = reap_leftovers(current_cluster="this-cluster")
        assert any("ended 2 leftover" in line for line in lines), lines
        deadline = time.monotonic() + 5
        while pids_alive(members) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_alive(members) == []
    finally:
        harness.kill()
        reap_leftovers(current_cluster="this-cluster")


def test_a_start_that_failed_for_the_environment_names_the_cause_first(tmp_path):
    """The error a user saw after ``pip install ordeal[vllm]``: transformers
    imports a torchvision that does not fit torch, and the replica exits.
    The wait names the cause and the fix before the log's traceback; a
    start that failed for anything else names no cause."""
    crash = ("import sys; print('RuntimeError: operator torchvision::nms does not exist'); "
             "sys.exit(1)")
    n = node(tmp_path, [sys.executable, "-c", crash])
    n.start()
    with pytest.raises(NodeNotReady) as err:
        n.wait_ready(60)
    n.stop()
    msg = str(err.value)
    assert msg.index("known cause: the environment's torchvision does not fit its torch") < (
        msg.index("last log lines")), msg
    assert "pip uninstall -y torchvision torchaudio torchcodec" in msg
    other = node(tmp_path, [sys.executable, "-c", "import sys; print('bad model'); sys.exit(3)"],
                 name="n1")
    other.start()
    with pytest.raises(NodeNotReady) as err:
        other.wait_ready(60)
    other.stop()
    assert "known cause" not in str(err.value)
