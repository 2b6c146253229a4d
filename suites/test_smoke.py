"""Smoke: the whole pipeline once, against the real local cluster.

Load through the router, SIGKILL one replica's process tree under load and
restart it, keep the load on until well after the heal, then judge the
history with every default invariant (consistency and SLO). Everything lands
in reports/runs/<run-id>/ (history.jsonl, summary.json).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from faults import Ledger, ProcessKill
from fixtures.run import PlannedFault
from fixtures.vllm_engine import SERVED_MODEL_NAME
from fixtures.workload import WorkloadSpec

pytestmark = [pytest.mark.smoke, pytest.mark.cluster]


def test_kill_and_restart_one_replica_under_load(ordeal_run, ordeal_config, ordeal_cluster):
    victim = ordeal_cluster.replicas()[-1]
    spec = WorkloadSpec(duration_s=ordeal_config.load_duration_s, rate=ordeal_config.load_rate,
                        seed=ordeal_config.seed)
    kill = ProcessKill(victim, ordeal_run.run_id, Ledger(), restart=True,
                       ready_timeout_s=ordeal_config.cluster.ready_timeout_s)

    ordeal_run.load(spec, [PlannedFault(kill, after_s=min(8.0, spec.duration_s / 4), hold_s=2.0)])
    results = ordeal_run.check()
    summary = ordeal_run.finish()

    # The fault happened and healed, as the history and the summary say.
    assert not summary["errors"], summary["errors"]
    [window] = summary["faults"]
    assert window["injected"] and window["healed"], window
    assert window["inject_result"]["signal"] == "SIGKILL"
    assert window["heal_result"]["restarted"] is True
    assert window["heal_result"]["pid"] != window["inject_result"]["pid"]
    nemesis_ops = [json.loads(line) for line in ordeal_run.run_dir.history_path.open()
                   if '"process":"nemesis"' in line]
    assert [(o["f"], o["value"]["phase"]) for o in nemesis_ops] == [
        ("inject", "begin"), ("inject", "end"), ("heal", "begin"), ("heal", "end")]

    # The restarted replica serves again, directly.
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "after the heal",
                       "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(victim.endpoint.url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["x-ordeal-node"] == victim.name

    # Enough real traffic, served by real vLLM, judged valid.
    assert summary["ops"]["invoked"] >= 200, summary["ops"]
    assert summary["ops"]["ok"] >= summary["ops"]["invoked"] // 2, summary["ops"]
    for node in summary["cluster"]["nodes"]:
        assert node["fingerprint"].startswith(("vllm-", "vllm-router-")), node
    names = {r.name for r in results}
    assert {"no_silent_loss", "stream_wellformed", "usage_matches_tokens", "canary_determinism",
            "slo_latency", "goodput", "error_rate", "availability", "recovery",
            "restart_readiness", "health_truthful", "counters_monotonic", "leak_bound"} <= names
    for r in results:
        assert r.valid is True, r.to_dict()
    assert summary["verdict"] == "pass"
