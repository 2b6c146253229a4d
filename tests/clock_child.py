"""A harness run in a child process, so that its own wall clock can be stepped
(tests/test_clock_jump.py starts it under libfaketime with only the wall
clock faked, as a real settimeofday or NTP step would move it).

    python tests/clock_child.py RUNS_DIR CLUSTER_JSON

Drives load through the session cluster's entrypoint with a latency fault on
the client-router link, checks, writes the summary, and prints
``RESULT {"run_dir": ...}``.
"""

from __future__ import annotations

import json
import random
import sys
from collections import deque
from pathlib import Path
from typing import Any

from faults.factory import build_faults
from faults.ledger import Ledger
from load.spec import WorkloadSpec
from ordeal.topology import Endpoint, Link
from reports.run_dir import RunDir
from runs.run import OrdealRun, PlannedFault


class Node:
    """A node of the session cluster, as this process addresses it."""

    def __init__(self, d: dict[str, Any]):
        self.name, self.role = d["name"], d["role"]
        self.endpoint = Endpoint(d["host"], d["port"])
        self.pid = d.get("pid")
        self.log = Path(d["log"]) if d.get("log") else None

    def log_tail(self, lines: int = 20) -> list[str]:
        if self.log is None:
            return []
        with self.log.open(errors="replace") as f:
            return list(deque(f, lines))


class Cluster:
    def __init__(self, spec: dict[str, Any]):
        self.nodes = [Node(d) for d in spec["nodes"]]
        self.router = next(n for n in self.nodes if n.role == "router")
        self.links = [Link(x["name"], x["src"], x["dst"], Endpoint(*x["listen"]),
                           Endpoint(*x["upstream"]), Endpoint(*x["control"]))
                      for x in spec["links"]]
        self.entrypoint = next(x.listen for x in self.links if x.name == "client-router")

    def replicas(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "replica"]

    def link(self, name: str) -> Link:
        return next(x for x in self.links if x.name == name)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def describe(self) -> dict[str, Any]:
        return {"backend": "attached", "entrypoint": self.entrypoint.url}


def main() -> int:
    runs, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    cluster = Cluster(spec)
    run = OrdealRun(RunDir.create(runs, "clock-jump"), "clock-jump", cluster,
                    progress=lambda m: print(m, flush=True))
    [fault] = build_faults("network_latency", "client-router", cluster, run.run_id, Ledger(),
                           random.Random(0), {"latency_ms": spec["latency_ms"]})
    load = WorkloadSpec(duration_s=spec["duration_s"], rate=spec["rate"], seed=7,
                        max_tokens=(8, 16), timeout_s=20)
    run.load(load, faults=[PlannedFault(fault, after_s=spec["inject_at_s"],
                                        hold_s=spec["hold_s"])],
             after_heal_s=spec["after_heal_s"], max_s=120)
    run.check()
    run.finish()
    print("RESULT " + json.dumps({"run_dir": str(run.run_dir.path)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
