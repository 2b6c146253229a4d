"""A run you can watch (issue 44): OpenMetrics served while a run goes,
from its history. Scraped over real HTTP and read with prometheus_client's
own parser: from a planted history (each figure where it must be), and from
a short run on the tests' shared real cluster, during the load and after
the check, against the run's summary."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from invariants import Result
from ordeal.history.ops import MONITOR, NEMESIS
from ordeal.history.writer import History
from runs.live_metrics import LiveMetrics


def scrape(address) -> dict[tuple[str, tuple], float]:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_planted_history_s_figures_are_served(tmp_path):
    h = History(tmp_path / "history.jsonl")
    h.append("invoke", 0, "completions", {"request_id": "a", "lag_ms": 12.0})
    h.append("ok", 0, "completions", {"ttft_ms": 30.0, "tpot_ms": 4.0, "e2e_ms": 90.0})
    h.append("invoke", 1, "completions", {"request_id": "b", "lag_ms": 3000.0})
    h.append("fail", 1, "completions", {}, "connection refused")
    h.append("info", MONITOR, "sample", {"node": "replica-0", "health": 200})
    for f, phase in (("inject", "begin"), ("inject", "end")):
        h.append("info", NEMESIS, f, {"kind": "process_pause", "target": "replica-1",
                                      "phase": phase})
    h.flush()
    live = LiveMetrics(tmp_path / "history.jsonl", "run-1", "suite-x")
    address = live.start(0)
    try:
        assert live.read_new() == 7
        m = scrape(address)
        assert m[("ordeal_requests_invoked_total", ())] == 2
        assert m[("ordeal_requests_total", (("outcome", "ok"),))] == 1
        assert m[("ordeal_requests_total", (("outcome", "fail"),))] == 1
        assert m[("ordeal_ttft_seconds_count", ())] == 1
        assert m[("ordeal_ttft_seconds_sum", ())] == pytest.approx(0.03)
        assert m[("ordeal_e2e_seconds_bucket", (("le", "0.1"),))] == 1
        assert m[("ordeal_schedule_lag_seconds_bucket", (("le", "2.5"),))] == 1  # 3 s: later
        open_ = ("ordeal_fault_windows_open", (("kind", "process_pause"),
                                               ("target", "replica-1")))
        assert m[open_] == 1
        assert m[("ordeal_faults_injected_total", (("kind", "process_pause"),))] == 1
        assert m[("ordeal_run_info", (("run_id", "run-1"), ("suite", "suite-x")))] == 1
        assert m[("ordeal_harness_rss_bytes", ())] > 10 * 2**20
        for f, phase in (("heal", "begin"), ("heal", "end")):
            h.append("info", NEMESIS, f, {"kind": "process_pause", "target": "replica-1",
                                          "phase": phase})
        h.flush()
        live.read_new()
        live.set_invariants([Result("no_silent_loss", True), Result("goodput", False),
                             {"name": "failover", "valid": "unknown"}])
        m = scrape(address)
        assert m[open_] == 0  # healed
        assert m[("ordeal_invariant_valid", (("invariant", "goodput"),))] == 0
        assert m[("ordeal_invariant_valid", (("invariant", "no_silent_loss"),))] == 1
        assert m[("ordeal_invariant_valid", (("invariant", "failover"),))] == -1
    finally:
        live.close()
        h.close()


@pytest.mark.cluster
def test_a_run_s_endpoint_is_scraped_while_it_goes_and_agrees_with_its_summary(
        ordeal_run, ordeal_say):
    from load.spec import WorkloadSpec
    run = ordeal_run
    run.metrics_port = 0  # a free port
    during: dict = {}

    def scrape_during() -> None:
        deadline = time.monotonic() + 20
        while run.live_metrics is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(4.0)  # well into the load
        if run.live_metrics is not None:
            during.update(scrape(run.live_metrics.address))
    scraper = threading.Thread(target=scrape_during)
    scraper.start()
    run.load(WorkloadSpec(duration_s=8, rate=6, seed=11), [])
    scraper.join()
    assert during.get(("ordeal_requests_invoked_total", ()), 0) > 0, during
    run.check()
    after = scrape(run.live_metrics.address)
    summary = run.finish()
    ordeal_say(f"metrics endpoint: {summary['metrics_endpoint']}")
    ops = summary["ops"]
    assert after[("ordeal_requests_invoked_total", ())] == ops["invoked"] > 0
    for outcome in ("ok", "fail", "info"):
        assert after.get(("ordeal_requests_total", (("outcome", outcome),)), 0) == ops[outcome]
    assert after[("ordeal_e2e_seconds_count", ())] == ops["ok"]
    for inv in summary["invariants"]:
        want = {True: 1, False: 0}.get(inv["valid"], -1) if isinstance(inv["valid"], bool) \
            else -1
        assert after[("ordeal_invariant_valid", (("invariant", inv["name"]),))] == want
    with pytest.raises(OSError):  # the endpoint ends with the run
        scrape(run.live_metrics.address)
