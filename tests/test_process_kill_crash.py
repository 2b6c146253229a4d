"""process_kill after a harness crash, and against a dead node: the ledger
is closed by heal-all, and a dead target is refused with nothing changed.
(Its effect and heal on real vLLM: tests/test_real_cluster.py.)"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import pids_alive
from faults import FaultError, Ledger, ProcessKill
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint


def node(tmp_path, argv, name="victim"):
    port = free_ports(1)[0]
    return LocalNode(name, "replica", Endpoint("127.0.0.1", port),
                     ManagedProcess(name, argv(port), dict(os.environ), tmp_path / f"{name}.log",
                                    "kill-run"), hint="test server")


def test_dead_node_is_refused_and_the_ledger_stays_empty(tmp_path, health_server_argv):
    n = node(tmp_path, health_server_argv)
    ledger = Ledger(tmp_path / "ledger")
    with pytest.raises(FaultError, match="not running"):
        ProcessKill(n, "r", ledger).inject()  # never started
    assert ledger.pending() == []


def test_heal_all_closes_a_kill_whose_harness_died(tmp_path, health_server_argv):
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {os.getcwd()!r})
        sys.path.insert(0, {os.path.join(os.getcwd(), "tests")!r})
        from pathlib import Path
        from faults import Ledger, ProcessKill
        from nodes.process import ManagedProcess
        from nodes.local import LocalNode
        from ordeal.topology import Endpoint
        argv = {health_server_argv(free_ports(1)[0])!r}
        n = LocalNode("victim", "replica", Endpoint("127.0.0.1", 1), ManagedProcess(
            "victim", argv, dict(os.environ), Path({str(tmp_path / "v.log")!r}), "crash-run"),
            hint="")
        n.start()
        print(n.pid, flush=True)
        ProcessKill(n, "crash-run", Ledger(), restart=True).inject()
        print("INJECTED", flush=True)
        time.sleep(600)  # the heal (a restart) never comes: SIGKILL arrives first
    """)
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               text=True, env=os.environ)
    try:
        victim = int(harness.stdout.readline())
        assert harness.stdout.readline().strip() == "INJECTED"
        harness.kill()
        harness.wait()
        assert pids_alive([victim]) == []  # the fault's effect: the node is gone
        [entry] = Ledger().pending()
        assert entry.kind == "process_kill" and entry.run_id == "crash-run"
        out = subprocess.run([sys.executable, "-m", "faults", "heal-all"], capture_output=True,
                             text=True, env=os.environ, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "closed process_kill on victim from run crash-run" in out.stdout, out.stdout
        assert Ledger().pending() == []
    finally:
        harness.kill()
