"""The full-chain health probe against the real cluster: one probe answers
within its per-check deadline while one replica is cut off (packets dropped:
a connect would otherwise hang) and another is paused (accepts, never
answers), names exactly those as "timeout", and says the rest are fine."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from engines.vllm.nodes import SERVED_MODEL_NAME
from faults.ledger import Ledger
from faults.network_partition import NetworkPartition
from faults.process_pause import ProcessPause
from load.health_probe import CHECK_DEADLINE_S, HealthProbe

pytestmark = pytest.mark.cluster
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)$")


async def probes(probe: HealthProbe, n: int) -> list[dict]:
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return [await probe.probe_once(session) for _ in range(n)]


def by_check(record: dict) -> dict[str, str]:
    return {f"{c['node']}/{c['what']}": c["status"] for c in record["checks"]}


def test_a_probe_answers_in_time_and_names_the_broken_nodes(ordeal_cluster, tmp_path):
    probe = HealthProbe(ordeal_cluster, tmp_path / "health.jsonl", model=SERVED_MODEL_NAME)
    cut, paused = ordeal_cluster.replicas()[:2]
    healthy = asyncio.run(probes(probe, 3))
    assert all(set(by_check(r).values()) <= {"ok", "absent"} for r in healthy), healthy
    ledger = Ledger(tmp_path / "ledger")
    with NetworkPartition(cut, "t-probe", ledger, mode="drop"), \
            ProcessPause(paused, "t-probe", ledger):
        broken = asyncio.run(probes(probe, 5))
    after = asyncio.run(probes(probe, 2))
    # This run's own time for a probe with nothing broken: the machine's load.
    overhead_ms = max(r["elapsed_ms"] for r in healthy + after)
    for record in broken:
        status = by_check(record)
        assert status[f"{cut.name}/health"] == "timeout" and status[f"{cut.name}/model"] == "timeout"
        assert status[f"{paused.name}/health"] == "timeout"
        assert status["router/health"] == "ok", status
        # Each check has its own deadline: the probe is not the sum of them
        # (its timed-out checks one after another would take their deadlines
        # added up, beyond this run's healthy probe time), and a dropped
        # connect (which would hang for minutes) cannot hold it.
        timeouts = sum(st == "timeout" for st in status.values())
        bound_ms = (timeouts - 0.5) * CHECK_DEADLINE_S * 1000 + overhead_ms
        assert record["elapsed_ms"] < bound_ms, (record["elapsed_ms"], bound_ms, status)
        assert ISO.match(record["time"]), record["time"]
        assert set(record["fingerprints"]) == {n.name for n in ordeal_cluster.nodes}
        assert record["fingerprints"][cut.name].startswith("vllm-")
    assert all(set(by_check(r).values()) <= {"ok", "absent"} for r in after), after
    worst = max(r["elapsed_ms"] for r in broken)
    print(f"health probe with a partition and a pause: worst {worst} ms of {len(broken)}")


def test_the_probe_thread_writes_one_line_per_probe_and_a_summary(ordeal_cluster, tmp_path):
    path = tmp_path / "health.jsonl"
    with HealthProbe(ordeal_cluster, path, model=SERVED_MODEL_NAME, interval_s=0.2) as probe:
        import time
        time.sleep(1.5)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    summary = probe.summary()
    assert summary["probes"] == len(lines) >= 3 and summary["error"] is None
    assert summary["checks"]["router/health"] == {"ok": len(lines)}
    assert summary["p99_ms"] >= summary["p50_ms"] > 0
