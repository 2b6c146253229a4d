"""The blast-radius guard (issue 11): load and faults go only to loopback,
the suite's own namespaces and containers, and networks the user names with
``--allow-target``; anything else is refused before a byte is sent or a
rule is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faults.base import FaultError
from faults.safety import require_ours
from load.client import url_endpoint
from load.spec import WorkloadSpec
from load.workload import WorkloadRunner
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from ordeal.networks import SESSION_NETWORKS, NotOurs
from ordeal.topology import Endpoint

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("url", ["http://10.20.30.40:8000", "http://example.invalid:80",
                                 "http://[2001:db8::1]:8000", "http://192.168.1.1"])
def test_load_to_an_outside_address_is_refused_before_anything_is_sent(tmp_path, url):
    history = History(tmp_path / "history.jsonl")
    with pytest.raises(NotOurs, match=r"load: .*(refusing to touch|not an IP address)"):
        WorkloadRunner(WorkloadSpec(duration_s=1.0), url, history)
    history.close()
    assert list(read_history(tmp_path / "history.jsonl")) == []  # nothing was recorded


def test_loopback_is_allowed_and_a_named_network_only_while_named(tmp_path):
    history = History(tmp_path / "history.jsonl")
    for url in ("http://127.0.0.1:8000", "http://localhost:9", "http://[::1]:8000"):
        WorkloadRunner(WorkloadSpec(duration_s=1.0), url, history)  # no error
    before = SESSION_NETWORKS.networks
    with SESSION_NETWORKS.allow("10.20.30.7/24") as allowance:
        assert str(allowance.net) == "10.20.30.0/24"
        require_ours(url_endpoint("http://10.20.30.40:8000"), "load")
        with pytest.raises(FaultError, match="refusing to touch 10.20.31.1"):
            require_ours(Endpoint("10.20.31.1", 80), "network_partition")
    assert SESSION_NETWORKS.networks == before
    with pytest.raises(FaultError, match="refusing to touch 10.20.30.40"):
        require_ours(Endpoint("10.20.30.40", 8000), "network_partition")
    with pytest.raises(NotOurs, match="not a network"):
        SESSION_NETWORKS.allow("10.20.30.0/33")
    history.close()


def test_a_bad_allow_target_is_a_usage_error_before_any_cluster_starts(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "suites/", "-m", "smoke",
         "--allow-target", "not-a-net", "--collect-only", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert "--allow-target 'not-a-net': not a network" in out.stderr, out.stderr
