"""A run whose fault did nothing is ``unknown``, with the reason (issue 23).

Real traffic on the session cluster while a real partition (iptables rules,
root) cuts a loopback port nobody listens on: every request succeeds, every
other invariant holds, and without fault_effective the verdict would be
``pass``: a claim about the cluster under a partition that was never felt.
"""

from __future__ import annotations

import pytest

from faults import iptables
from faults.ledger import Ledger
from faults.network_partition import NetworkPartition
from load.spec import WorkloadSpec
from nodes.ports import free_ports
from ordeal.history.ops import HARNESS
from ordeal.history.reader import read_history
from ordeal.topology import Endpoint
from reports.run_dir import RunDir
from runs.run import OrdealRun, PlannedFault

pytestmark = [pytest.mark.cluster,
              pytest.mark.needs("iptables (root, CAP_NET_ADMIN)", iptables.unavailable_reason)]


class AtAnUnusedPort:
    """A running node of the cluster seen at a loopback port nobody listens
    on: the partition's rules are real and no packet ever meets them."""

    def __init__(self, node, port: int):
        self.name, self.role, self.node = "unused-port", "replica", node
        self.endpoint = Endpoint("127.0.0.1", port)

    def is_running(self) -> bool:
        return self.node.is_running()


@pytest.mark.timeout(300)
def test_a_partition_nobody_feels_makes_the_run_unknown_with_that_reason(
        ordeal_cluster, ordeal_say, tmp_path):
    run = OrdealRun(RunDir.create(tmp_path, "fault-effective"), "fault-effective",
                    ordeal_cluster, ordeal_say)
    ghost = AtAnUnusedPort(ordeal_cluster.replicas()[0], free_ports(1)[0])
    fault = NetworkPartition(ghost, run.run_id, Ledger())
    run.load(WorkloadSpec(duration_s=10.0, rate=3.0, seed=23, max_tokens=(4, 8)),
             faults=[PlannedFault(fault, after_s=1.0, hold_s=2.0)], after_heal_s=4.0)
    run.check()
    summary = run.finish()
    by_name = {i["name"]: i for i in summary["invariants"]}
    effective = by_name["fault_effective"]
    ordeal_say(f"fault_effective: {effective['valid']}: {effective['details'].get('why')}")
    assert summary["ops"]["ok"] >= 10 and summary["ops"]["fail"] == 0, summary["ops"]
    assert effective["valid"] == "unknown", effective
    assert effective["details"]["no_effect"] == 1 and effective["details"]["windows"] == 1
    [example] = effective["counterexamples"]
    assert example["target"] == "unused-port" and example["evidence"]["packets_matched"] == 0
    assert "network_partition on unused-port showed no effect" in example["problem"]
    # The rest judged the run as it was: nothing false, so the verdict rests
    # on the fault that did nothing.
    assert not [n for n, i in by_name.items() if i["valid"] is False], by_name
    assert summary["verdict"] == "unknown"
    # The evidence is in the history: the heal op carries the observation.
    heals = [op for op in read_history(run.run_dir.history_path)
             if op.process == "nemesis" and op.f == "heal" and op.value.get("phase") == "end"]
    assert heals[0].value["effect"]["effective"] is False
    # The load ran its 10 s: the heal (at ~3 s) plus its 4 s after-heal time
    # ended inside them, so nothing was added past the duration (the
    # after-heal time once counted from the end of the duration: 14 s).
    invokes = [op.time_ns for op in read_history(run.run_dir.history_path)
               if op.type == "invoke" and op.process not in HARNESS]
    assert (invokes[-1] - invokes[0]) / 1e9 < 10.0 + 4.0 / 2, (invokes[0], invokes[-1])
