"""Latency from the schedule (issue 26): a stalled server fills the in-flight
limit while requests keep being due. Due-time TTFT must hold the wait, the
client's send-time TTFT must not, and schedule_lag must name the cause.

A stub server holds each answer (a stall real vLLM gives only under a fault),
so the lag is known by construction; the same recording runs against real
vLLM in every smoke run (``slo_latency``'s ``lag_ms`` and ``schedule_lag``).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp import web

from invariants import LatencySLO, RunContext, ScheduleLag
from invariants.requests import RequestPairer, Timeline
from invariants.settings import CheckerSettings, SLOTargets
from invariants.slo import figure
from load.spec import WorkloadSpec
from load.workload import WorkloadRunner
from nodes.ports import free_ports
from ordeal.history.ops import Op
from ordeal.history.reader import read_history
from ordeal.history.writer import History

HOLD_S = 1.0
CHUNK = 'data: {"id":"c1","choices":[{"text":"x","finish_reason":%s}]}\n\n'


async def held(request):
    """Every answer waits HOLD_S before its first byte: the stall."""
    await asyncio.sleep(HOLD_S)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for part in (CHUNK % "null", CHUNK % '"length"', "data: [DONE]\n\n"):
        await resp.write(part.encode())
    return resp


@contextlib.asynccontextmanager
async def serving(handler):
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def stalled_history(tmp_path, mode="open") -> list[Op]:
    async with serving(held) as port:
        h = History(tmp_path / "h.jsonl")
        # about 8 requests due within 0.4 s, two slots: three rounds of HOLD_S
        spec = WorkloadSpec(duration_s=0.4, rate=20, stream_share=1.0, canary_every=0,
                            timeout_s=30, seed=3, max_in_flight=2, mode=mode, concurrency=2)
        await WorkloadRunner(spec, f"http://127.0.0.1:{port}", h).run()
        h.close()
        return list(read_history(tmp_path / "h.jsonl"))


async def test_due_time_ttft_holds_the_wait_send_time_does_not(tmp_path):
    ops = await stalled_history(tmp_path)
    invokes = [o for o in ops if o.type == "invoke"]
    assert len(invokes) >= 4, "the plan must queue past the in-flight limit"
    assert sum(bool(o.value.get("queued")) for o in invokes) >= len(invokes) - 2

    pairer = RequestPairer(Timeline(30.0))
    reqs = [r for r in (pairer.feed(o) for o in ops) if r is not None]
    assert reqs and all(r.done.type == "ok" for r in reqs)
    for r in reqs:  # due-time = the client's figure + the lag, exactly
        assert figure(r, "ttft_ms") == pytest.approx(r.done.value["ttft_ms"] + figure(r, "lag_ms"))
        assert figure(r, "ttft_ms_sent") == r.done.value["ttft_ms"]
    sent = max(figure(r, "ttft_ms_sent") for r in reqs)
    due = max(figure(r, "ttft_ms") for r in reqs)
    lag = max(figure(r, "lag_ms") for r in reqs)
    # the queued waited whole rounds of HOLD_S for a slot: due-time shows it
    assert lag >= sent, (lag, sent)
    assert due >= 2 * sent, (due, sent)

    # judged from the due time: a target above every send-time TTFT is missed
    target = 1.5 * sent
    slo = LatencySLO().check(ops, RunContext(settings=CheckerSettings(
        slo=SLOTargets(ttft_ms=target, e2e_ms=1e6))))
    assert slo.valid is False and "ttft_ms" in slo.details["breaches"]
    steady = slo.details["windows"]["steady"]
    assert steady["ttft_ms_sent"]["max"] <= target < steady["ttft_ms"]["max"]
    assert steady["lag_ms"]["max"] == pytest.approx(lag, rel=0.05)

    # the schedule lag names the cause: the in-flight limit, not the harness
    r = ScheduleLag().check(ops, RunContext(settings=CheckerSettings(max_schedule_lag_ms=sent / 2)))
    assert r.valid == "unknown"
    assert "harness-bound" in r.details["why"] and "in-flight limit" in r.details["why"]
    assert r.details["queued_for_in_flight_limit"] >= len(invokes) - 2
    worst = {o.index: o for o in invokes}[r.counterexamples[0]["index"]]
    assert worst.value["lag_ms"] == max(o.value["lag_ms"] for o in invokes)
    # under a bound above the worst lag the same history keeps to its schedule
    ok = ScheduleLag().check(ops, RunContext(settings=CheckerSettings(max_schedule_lag_ms=lag + 1)))
    assert ok.valid is True


async def test_closed_loop_has_no_schedule(tmp_path):
    ops = await stalled_history(tmp_path, mode="closed")
    assert not any("lag_ms" in o.value for o in ops if o.type == "invoke")
    r = ScheduleLag().check(ops, RunContext())
    assert r.valid is True and "closed loop" in r.details["why"]


def test_harness_late_without_queueing_is_named():
    ops = [Op(i, i * 10**8, "2026-12-02T00:00:00Z", "invoke", i, "completion",
              {"seq": i, "lag_ms": 2500.0}) for i in range(10)]
    r = ScheduleLag().check(ops, RunContext())
    assert r.valid == "unknown"
    assert "too busy to send them on time" in r.details["why"]
