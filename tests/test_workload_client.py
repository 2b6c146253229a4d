"""The workload client against hostile and broken servers.

A stub server is used here *only* to plant stream faults that real vLLM does
not produce on demand; the same recording path is exercised against real
vLLM in test_real_cluster.py and the smoke suite. Every case must end as a
recorded op with its reason, and the checkers must judge it right.
"""

import asyncio
import contextlib
import json

import pytest
from aiohttp import web

from invariants import NoSilentLoss, RunContext, StreamWellFormed
from load.spec import WorkloadSpec
from load.workload import WorkloadRunner
from nodes.ports import free_ports
from ordeal.history.reader import read_history
from ordeal.history.writer import History

CHUNK = 'data: {"id":"c1","choices":[{"text":"x","finish_reason":%s}]}\n\n'


def stream_of(*parts: str):
    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "x-ordeal-node": "stub"})
        await resp.prepare(request)
        for p in parts:
            await resp.write(p.encode() if isinstance(p, str) else p)
        return resp
    return handler


async def truncated(request):
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write((CHUNK % "null").encode())
    request.transport.close()  # the server dies mid-stream
    return resp


async def hang(request):
    await asyncio.sleep(3)
    return web.Response(text="late")


async def http_500(request):
    return web.json_response({"error": {"message": "engine dead"}}, status=500)


async def http_400(request):
    return web.json_response({"error": {"message": "max_tokens too large"}}, status=400)


SCENARIOS = {
    "good": stream_of(CHUNK % "null", CHUNK % '"length"', "data: [DONE]\n\n"),
    "two_finish": stream_of(CHUNK % '"length"', CHUNK % '"stop"', "data: [DONE]\n\n"),
    "malformed": stream_of(CHUNK % "null", "data: {oops\n\n", "data: [DONE]\n\n"),
    "error_event": stream_of(CHUNK % "null",
                             'data: {"error": {"message": "worker crashed", "code": 500}}\n\n',
                             "data: [DONE]\n\n"),
    "after_done": stream_of(CHUNK % '"length"', "data: [DONE]\n\n", CHUNK % "null"),
    "bad_utf8": stream_of(b"data: \xff\xfe\n\n", CHUNK % '"length"', "data: [DONE]\n\n"),
    "truncated": truncated,
    "hang": hang,
    "http_500": http_500,
    "http_400": http_400,
}


@contextlib.asynccontextmanager
async def serving(handler):
    """A stub OpenAI server on loopback answering both endpoints with ``handler``."""
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


async def run_against(path_handler, tmp_path, timeout_s=2.0):
    async with serving(path_handler) as port:
        h = History(tmp_path / "h.jsonl")
        spec = WorkloadSpec(duration_s=0.3, rate=20, stream_share=1.0, canary_every=0,
                            timeout_s=timeout_s, seed=1)
        await WorkloadRunner(spec, f"http://127.0.0.1:{port}", h).run()
        h.close()
        return list(read_history(tmp_path / "h.jsonl"))


def judge(history):
    ctx = RunContext()
    return NoSilentLoss().check(history, ctx), StreamWellFormed().check(history, ctx)


EXPECT = {  # scenario -> (op type, error contains, stream_wellformed valid)
    "good": ("ok", None, True),
    "two_finish": ("ok", None, False),
    "malformed": ("fail", "malformed stream", False),
    "error_event": ("fail", "error event in stream", "unknown"),
    "after_done": ("ok", None, False),
    "bad_utf8": ("fail", "malformed stream", False),
    "truncated": ("info", "connection lost", "unknown"),
    "hang": ("info", "timeout after", "unknown"),
    "http_500": ("info", "HTTP 500", "unknown"),
    "http_400": ("fail", "HTTP 400", "unknown"),
}


@pytest.mark.parametrize("name", sorted(EXPECT))
async def test_each_broken_server_ends_as_a_recorded_op(name, tmp_path):
    history = await run_against(SCENARIOS[name], tmp_path, timeout_s=1.0)
    completions = [o for o in history if o.type != "invoke"]
    kind, err, stream_valid = EXPECT[name]
    assert completions and all(o.type == kind for o in completions), (name, completions[:1])
    if err:
        assert all(err in (o.error or "") for o in completions), completions[0].error
    loss, stream = judge(history)
    assert loss.valid is True  # nothing lost, whatever the server did
    assert stream.valid == stream_valid, stream.to_dict()


async def test_unreachable_node_is_recorded_as_fail(tmp_path):
    port = free_ports(1)[0]  # nothing listens here
    h = History(tmp_path / "h.jsonl")
    spec = WorkloadSpec(duration_s=0.3, rate=20, seed=2, timeout_s=2)
    await WorkloadRunner(spec, f"http://127.0.0.1:{port}", h).run()
    h.close()
    history = list(read_history(tmp_path / "h.jsonl"))
    fails = [o for o in history if o.type == "fail"]
    assert fails and len(fails) == h.counts["invoke"]
    assert all("connect failed (request not sent)" in o.error for o in fails)
    assert NoSilentLoss().check(history, RunContext()).valid is True


async def test_closed_loop_keeps_one_request_per_client_in_flight(tmp_path):
    async with serving(SCENARIOS["good"]) as port:
        h = History(tmp_path / "h.jsonl")
        spec = WorkloadSpec(mode="closed", concurrency=3, duration_s=0.5, seed=4, stream_share=1.0)
        await WorkloadRunner(spec, f"http://127.0.0.1:{port}", h).run()
        h.close()
    history = list(read_history(tmp_path / "h.jsonl"))
    assert {o.process for o in history} == {"c0", "c1", "c2"}
    open_now: set = set()
    for o in history:  # never two requests of one client at once
        if o.type == "invoke":
            assert o.process not in open_now
            open_now.add(o.process)
        else:
            open_now.remove(o.process)
    assert not open_now and h.counts["ok"] == h.counts["invoke"] > 10


async def slow_json(request):
    """A whole, valid JSON answer that arrives in pieces (a slow link)."""
    body = json.dumps({"id": "c1", "choices": [{"text": "x" * 3000, "finish_reason": "length"}],
                       "usage": {"completion_tokens": 3}}).encode()
    resp = web.StreamResponse(headers={"content-type": "application/json"})
    resp.content_length = len(body)
    await resp.prepare(request)
    for i in range(0, len(body), 500):
        await resp.write(body[i:i + 500])
        await asyncio.sleep(0.01)
    return resp


async def test_a_body_that_arrives_slowly_is_read_whole(tmp_path):
    async with serving(slow_json) as port:
        h = History(tmp_path / "h.jsonl")
        spec = WorkloadSpec(duration_s=0.3, rate=10, stream_share=0.0, canary_every=0,
                            timeout_s=5, seed=3)
        await WorkloadRunner(spec, f"http://127.0.0.1:{port}", h).run()
        h.close()
    done = [o for o in read_history(tmp_path / "h.jsonl") if o.type != "invoke"]
    assert done and all(o.type == "ok" for o in done), [o.error for o in done][:2]
