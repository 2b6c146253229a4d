"""Run only by tests/test_xdist.py, under ``pytest -n 2 --dist each``: both
workers run this one test, each against its own cluster. gw0 cuts all of
its replicas off; gw1, meanwhile, sees every one of its own replicas answer
and shares no port, chain or ledger entry with gw0. The two meet through
files in $ORDEAL_XDIST_SYNC. (Not collected by a plain ``pytest tests/``:
the file name does not start with ``test_``.)"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

from faults.iptables import list_chains
from faults.ledger import Ledger
from faults.network_partition import NetworkPartition

SYNC = Path(os.environ.get("ORDEAL_XDIST_SYNC", "/nonexistent"))


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for(name: str, timeout: float = 300.0) -> Path:
    path = SYNC / name
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"the other worker never wrote {name}"
        time.sleep(0.2)
    return path


def test_a_fault_in_one_worker_never_reaches_the_other(ordeal_cluster, ordeal_config):
    me = ordeal_config.worker.worker
    assert me in ("gw0", "gw1"), f"run under pytest -n 2, not as {me}"
    mine = ordeal_cluster.replicas()
    ports = [n.endpoint.port for n in ordeal_cluster.nodes] + \
        [x.listen.port for x in ordeal_cluster.links]
    (SYNC / f"{me}.json").write_text(json.dumps({"ports": ports,
                                                 "state": os.environ["ORDEAL_STATE_DIR"]}))
    other = json.loads(wait_for("gw1.json" if me == "gw0" else "gw0.json").read_text())
    assert set(ports).isdisjoint(other["ports"]), "two workers share a port"
    if me == "gw0":
        fault = NetworkPartition(mine, f"xdist-{me}", Ledger(), mode="reject")
        with fault:
            assert not any(answers(n.endpoint.url) for n in mine)
            (SYNC / "cut").write_text(fault.chain)
            wait_for("observed", 120)
        assert all(answers(n.endpoint.url) for n in mine)
    else:
        chain = wait_for("cut").read_text()
        assert chain in [c.name for c in list_chains()]  # gw0's cut is in force now
        seen = [answers(n.endpoint.url) for n in mine for _ in range(5)]
        assert Ledger().pending() == []  # gw0's fault is not in our ledger
        (SYNC / "observed").write_text(json.dumps(seen))
        assert all(seen), f"a fault of gw0 reached gw1's replicas: {seen}"
