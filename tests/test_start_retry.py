"""A start the machine failed is retried once, and recorded (issue 46).

A port is chosen, then bound by the node a moment later: another process
may take it in between (vLLM's engine binds ephemeral ports while the
other replicas load). That start failed for the machine, not the system
under test, so the cluster starts that node once more on new ports and
says so in summary.json's ``cluster.start_retries``; any other failure is
raised at once, never retried. Against real CPU Triton replicas (a start
takes seconds), the port really taken by a listening socket.
"""

from __future__ import annotations

import socket

import pytest

import clusters.local as local
from engines.triton.server import check as triton_missing
from nodes.waits import machine_cause
from ordeal.config import ClusterSpec
from ordeal.topology import NodeNotReady


def test_only_a_machine_cause_is_named_for_a_retry():
    assert "port was taken" in machine_cause("uvicorn: [Errno 98] Address already in use")
    assert "port was taken" in machine_cause(
        "failed to start HTTP service: Unavailable - Socket '127.0.0.1:45531' already in use")
    assert machine_cause("operator torchvision::nms does not exist") is None  # the environment's
    assert machine_cause("CUDA out of memory") is None  # the system under test's


@pytest.fixture
def taken_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


def first_ports_taken(monkeypatch, taken: int, calls: int) -> None:
    """``free_ports`` in clusters/local.py gives ``taken`` first, for its
    first ``calls`` calls: the race, made certain."""
    real, count = local.free_ports, [0]

    def racing(n: int, host: str = "127.0.0.1") -> list[int]:
        count[0] += 1
        ports = real(n, host)
        return [taken, *ports[1:]] if count[0] <= calls else ports
    monkeypatch.setattr(local, "free_ports", racing)


@pytest.mark.cluster
def test_a_replica_whose_port_was_taken_is_started_once_more_and_recorded(
        tmp_path, monkeypatch, taken_port):
    if triton_missing():
        pytest.fail("a CPU Triton node cannot start here (run bash .ci/setup): "
                    + "; ".join(triton_missing()))
    first_ports_taken(monkeypatch, taken_port, calls=1)
    said: list[str] = []
    spec = ClusterSpec(engine="triton", replicas=1)
    with local.LocalCluster(spec, "retry-start", tmp_path, progress=said.append) as cluster:
        [replica] = cluster.replicas()
        assert replica.endpoint.port != taken_port
        [retry] = cluster.describe()["start_retries"]
        assert retry["node"] == "replica-0" and "port was taken" in retry["why"], retry
        assert any("starting it once more" in line for line in said), said
        assert cluster.nodes.count(replica) == 1 and len(cluster.replicas()) == 1


@pytest.mark.cluster
def test_a_second_machine_failure_is_raised_not_retried_again(tmp_path, monkeypatch, taken_port):
    if triton_missing():
        pytest.fail("a CPU Triton node cannot start here (run bash .ci/setup): "
                    + "; ".join(triton_missing()))
    first_ports_taken(monkeypatch, taken_port, calls=2)
    said: list[str] = []
    cluster = local.LocalCluster(ClusterSpec(engine="triton", replicas=1), "retry-twice",
                                 tmp_path, progress=said.append)
    try:
        with pytest.raises(NodeNotReady, match="already in use"):
            cluster.start()
    finally:
        cluster.stop()
    assert len(cluster.start_retries) == 1, cluster.start_retries
