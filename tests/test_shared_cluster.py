"""A session's shared cluster: a node an earlier run left dead is started
again before the next run, said and recorded; a fault aimed at a dead node
says why it is down; the monitor's drain round records a dead node's exit."""

import os
import signal
import sys
from dataclasses import dataclass, field

import pytest

from faults import Ledger
from faults.base import FaultError
from faults.process_pause import ProcessPause
from load.monitor import sample_node
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint
from runs.shared_cluster import revive_down_nodes

SERVER = r"""
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


@dataclass
class Cluster:
    nodes: list
    backend: str = "local"
    said: list = field(default_factory=list)


@pytest.fixture
def node(tmp_path):
    port = free_ports(1)[0]
    proc = ManagedProcess("replica-1", [sys.executable, "-c", SERVER, str(port)],
                          dict(os.environ), tmp_path / "replica-1.log", "shared-test")
    n = LocalNode("replica-1", "replica", Endpoint("127.0.0.1", port), proc, hint="")
    n.start()
    try:
        n.wait_ready(30)
        yield n
    finally:
        n.stop(grace=2)


def test_a_node_killed_in_an_earlier_run_is_started_again_and_recorded(node, tmp_path):
    cluster = Cluster([node])
    assert revive_down_nodes(cluster, 30, cluster.said.append) == []  # all up: nothing done
    first = node.pid
    node.signal(signal.SIGKILL)
    node.process.proc.wait(10)
    assert not node.is_running() and node.exit_code() == -signal.SIGKILL
    # A fault aimed at it says why it is down, from its own state and log.
    with pytest.raises(FaultError, match=r"not running \(its process exited with code -9; "
                                         r"its last log lines: .*serving"):
        ProcessPause(node, "t", Ledger(tmp_path / "ledger")).inject()
    dead = sample_node(node, timeout=1.0)
    assert dead["health"] is None and dead["exit_code"] == -9
    [record] = revive_down_nodes(cluster, 30, cluster.said.append)
    assert record["node"] == "replica-1" and record["exit_code"] == -9, record
    assert node.is_running() and node.pid != first
    assert sample_node(node, timeout=2.0)["health"] == 200
    assert "replica-1 is down before this run" in cluster.said[0]


def test_a_deployment_ordeal_did_not_start_is_left_as_it_is(node):
    node.signal(signal.SIGKILL)
    node.process.proc.wait(10)
    assert revive_down_nodes(Cluster([node], backend="external"), 30, print) == []
    assert not node.is_running()
