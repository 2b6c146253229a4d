"""The benchmarks' own helpers: percentiles as vLLM computes them, the
sustained-step judgement, the fault bench's first-seen rule, and the bench
SSE server against the suite's real client (no timing is asserted)."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import numpy as np
import pytest

from bench.bench_faults import Probe, first_seen
from bench.bench_load import sustained
from bench.common import diff_pct, pct, start_sse_server
from bench.load_clients import stamps
from load.client import send_request
from load.plan import PlannedRequest


def test_pct_is_numpys_linear_percentile():
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert pct(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert pct([], 50) is None


def test_diff_pct():
    assert diff_pct(105.0, 100.0) == 5.0
    assert diff_pct(95.0, 100.0) == -5.0
    assert diff_pct(1.0, 0.0) is None and diff_pct(None, 1.0) is None


def base_result(**kw):
    res = {"ok": 100, "sent": 100, "achieved_rps": 99.0, "cpu_share": 0.3,
           "dispatch_lag_ms": {"p50": 0.2, "p99": 80.0}, "chunk_lag_ms": {"p50": 0.4, "p99": 90.0}}
    res.update(kw)
    return res


def test_sustained_judges_each_condition():
    assert sustained(base_result(), 100) == (True, "")  # p99 lags are not judged
    ok, why = sustained(base_result(ok=99), 100)
    assert not ok and "1 of 100" in why
    ok, why = sustained(base_result(achieved_rps=90.0), 100)
    assert not ok and "achieved 90.0" in why
    ok, why = sustained(base_result(cpu_share=0.95), 100)
    assert not ok and "CPU-bound" in why
    ok, why = sustained(base_result(chunk_lag_ms={"p50": 7.0, "p99": 9.0}), 100)
    assert not ok and "chunk_lag p50" in why
    assert sustained(base_result(achieved_rps=10.0), None)[0]  # closed loop: no rate target


def test_first_seen_takes_the_first_probe_and_the_share_that_agrees():
    t = 100.0
    probes = [Probe(t + 0.001 * i, t + 0.001 * i + 0.0005, 200 if i < 3 else None,
                    None if i < 3 else "refused") for i in range(10)]
    sent, done, agree = first_seen(probes, lambda p: p.error == "refused", t)
    assert sent == pytest.approx(3.0) and done == pytest.approx(3.5) and agree == 1.0
    probes[6].status, probes[6].error = 200, None
    assert first_seen(probes, lambda p: p.error == "refused", t)[2] == pytest.approx(6 / 7)
    assert first_seen(probes[:3], lambda p: p.error == "refused", t) == (None, None, None)


def test_bench_sse_server_streams_what_the_suite_client_accepts(tmp_path):
    server, port = start_sse_server(2.0, log=tmp_path / "sse.log")
    try:
        req = PlannedRequest(0, 0.0, "completions", True, "a b c", 7, 0.0, True)

        async def go():
            async with aiohttp.ClientSession() as s:
                return await send_request(s, f"http://127.0.0.1:{port}", req, "ordeal-tiny",
                                          10.0, True, "rid-1")

        out = asyncio.run(go())
    finally:
        server.stop()
    assert out.type == "ok", out.error
    v = out.value
    assert v["output_tokens"] == 7 and v["finish_reason"] == "length"
    assert v["stream"]["sequence_problems"] == [] and v["stream"]["n_token_ids"] == 7
    written = [stamps(text)[0] for text in v["stream"]["texts"]]
    assert len(written) == 7 and written == sorted(written)
    assert len(v["itl_ms"]) == 6
