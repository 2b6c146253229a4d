"""Hostile responses (issue 11): the SSE parser, the stream recorder, the
answer's shape check and the /metrics parser, fuzzed with Hypothesis.

What must hold for any input: nothing but the documented error escapes, the
parser's state stays bounded (memory), the work stays linear (no quadratic
re-slicing), and what is recorded is JSON the history can write. CI runs
``FUZZ_EXAMPLES`` cases per property (default 300); a longer campaign by hand:

    ORDEAL_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/test_fuzz_parsers.py

The same client against a real server that misbehaves (malformed JSON and a
cut body injected by the fault proxy in front of real vLLM) is
tests/test_http_fault*.py / suites/faults; the hostile server at the end of
this file covers what no proxy toxic produces (a stream that never ends,
bytes after [DONE], an enormous line, invalid UTF-8, JSON nested 10^5 deep).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from load.client import answer_shape, send_request
from load.metrics import MetricsParseError, parse_metrics
from load.plan import PlannedRequest
from load.sse import (
    MAX_EVENT_BYTES,
    MAX_KEPT_PROBLEMS,
    MAX_STREAM_CHUNKS,
    SSEEvent,
    SSEParser,
    StreamRecorder,
)

FUZZ_EXAMPLES = int(os.environ.get("ORDEAL_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Bytes that look like SSE often enough to reach every branch.
SSE_PIECES = st.sampled_from([
    b"data: ", b"data:", b"event: error\n", b"event: message\n", b": keep-alive\n", b"id: 7\n",
    b"retry: 10\n", b"bogus: x\n", b"\n", b"\r\n", b"\r", b"[DONE]", b"{", b"}", b'"',
    b'{"choices":[{"text":"a","finish_reason":null}]}', b'{"error":"boom"}',
    b'{"choices":[{"delta":{"content":"b","token_ids":[1,2]}}],"usage":{"completion_tokens":2}}',
    b"\xff\xfe", b"\xc3", b"\x00", b"data: [DONE]\n\n"])
SSE_BYTES = st.lists(st.one_of(SSE_PIECES, st.binary(max_size=40)), max_size=60).map(b"".join)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.sampled_from(["choices", "text", "delta", "content", "usage",
                                       "completion_tokens", "token_ids", "finish_reason",
                                       "id", "error", "message", "created",
                                       "system_fingerprint"]) | st.text(max_size=5),
                      children, max_size=6),
    max_leaves=30)


def events_of(parser: SSEParser, chunks: list[bytes]) -> list[tuple[str, str]]:
    out = [(e.event, e.data) for c in chunks for e in parser.feed(c)]
    return out + [(e.event, e.data) for e in parser.close()]


@FUZZ
@given(SSE_BYTES, st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_sse_events_do_not_depend_on_how_the_bytes_arrive(data, cuts):
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    whole, split = SSEParser(), SSEParser()
    assert events_of(split, pieces) == events_of(whole, [data])
    assert split.problems == whole.problems
    assert len(whole.problems) <= MAX_KEPT_PROBLEMS <= whole.n_problems + MAX_KEPT_PROBLEMS


@FUZZ
@given(st.lists(st.one_of(SSE_PIECES, st.binary(min_size=50, max_size=300)), max_size=40))
def test_sse_parser_state_stays_bounded(chunks):
    p = SSEParser(max_line=64)
    for c in chunks:
        for ev in p.feed(c):
            assert len(ev.data) <= MAX_EVENT_BYTES + 64
        assert len(p._buf) <= 64  # never buffers a line past max_line
        assert len(p.problems) <= MAX_KEPT_PROBLEMS


def test_sse_event_data_is_capped_and_the_cut_is_said():
    p = SSEParser()
    line = b"data: " + b"x" * ((1 << 20) - 100) + b"\n"
    events = list(p.feed(line * 6 + b"\n"))
    assert len(events) == 1 and len(events[0].data) <= MAX_EVENT_BYTES
    assert any("event data longer than" in x for x in p.problems), p.problems


def test_sse_many_short_lines_cost_linear_time():
    """1 MB of 2-byte lines in one chunk: re-slicing the buffer after each
    line (as the parser once did) copies the rest each time, ~2.5e11 bytes."""
    p = SSEParser()
    t = time.process_time()
    assert list(p.feed(b":\n" * 500_000)) == []
    assert time.process_time() - t < 5.0  # linear: ~0.2 s; quadratic: minutes


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["message", "error", "x"]),
                          st.one_of(JSON.map(json.dumps), st.text(max_size=30),
                                    st.just("[DONE]"))), max_size=30))
def test_stream_recorder_takes_any_event_and_records_json(events):
    rec = StreamRecorder(0)
    for i, (name, data) in enumerate(events):
        rec.on_event(SSEEvent(name, data), now_ns=i * 1000)
    value = rec.record.to_value()
    json.dumps(value, allow_nan=True)  # the history can write it
    assert len(value["errors"]) <= 5 and len(value["malformed"]) <= 5
    assert len(value["ids"]) <= 9 and value["n_chunks"] >= len(value["texts"])


def test_stream_recorder_keeps_at_most_max_chunks_and_counts_the_rest():
    rec = StreamRecorder(0)
    ev = SSEEvent("message", json.dumps({"id": "c", "choices": [{"text": "a"}]}))
    for i in range(MAX_STREAM_CHUNKS + 10):
        rec.on_event(ev, now_ns=i)
    r = rec.record
    assert r.n_chunks == MAX_STREAM_CHUNKS + 10 and len(r.text_parts) == len(r.token_times_ns) == MAX_STREAM_CHUNKS
    assert any("counted, not kept" in m for m in r.malformed)
    many_ids = StreamRecorder(0)
    for i in range(1000):
        many_ids.on_event(SSEEvent("message", json.dumps({"id": f"c{i}", "choices": []})))
    assert len(many_ids.record.ids) == 9 and many_ids.record.ids[-1] == "..."


@FUZZ
@given(st.dictionaries(st.sampled_from(["choices", "usage", "id", "error"]), JSON, max_size=4))
def test_answer_shape_is_a_triple_or_a_reason(payload):
    shape = answer_shape(payload)
    if isinstance(shape, str):
        assert shape
    else:
        choice, text, usage = shape
        assert isinstance(choice, dict) and isinstance(text, str) and isinstance(usage, dict)


METRIC_PIECES = st.sampled_from([
    "# HELP vllm:num_requests_running x\n", "# TYPE vllm:num_requests_running gauge\n",
    "vllm:num_requests_running 3\n", 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n',
    "process_resident_memory_bytes 1e9\n", "x{a=\"\\\"\"} NaN\n", "# TYPE h histogram\n",
    "h_bucket{le=\"+Inf\"} 2\n", "{", "}", "=", " ", "\n", "\"", "#", "\\", "NaN", "1e999"])


@FUZZ
@given(st.lists(st.one_of(METRIC_PIECES, st.text(max_size=20)), max_size=30).map("".join))
def test_metrics_parser_returns_figures_or_its_own_error(text):
    try:
        out = parse_metrics(text)
    except MetricsParseError as e:
        assert "not Prometheus text" in str(e)
    else:
        assert all(isinstance(v, float) for v in out.values())


# ------------------------------------------------------- a hostile server


class Hostile:
    """A raw HTTP/1.1 server on loopback that answers every request with the
    bytes a case gives it (a stub, allowed for testing the harness's client
    in isolation; see the module docstring for the real-server tests)."""

    def __init__(self, body: bytes | None, forever: bool = False,
                 headers: bytes = b"Content-Type: text/event-stream\r\n"):
        self.body, self.forever, self.headers = body, forever, headers

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n" + self.headers + b"Connection: close\r\n\r\n")
            writer.write(self.body or b"")
            await writer.drain()
            while self.forever:  # a stream that never ends: a keep-alive now and then
                await asyncio.sleep(0.05)
                writer.write(b": still here\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _send(hostile: Hostile, stream: bool = True, timeout_s: float = 5.0):
    server = await asyncio.start_server(hostile.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    req = PlannedRequest(1, 0.0, "completions", stream, "hi", 8, 0.0, False)
    try:
        async with aiohttp.ClientSession() as session:
            t = time.monotonic()
            out = await send_request(session, f"http://127.0.0.1:{port}", req, "m", timeout_s)
            return out, time.monotonic() - t
    finally:
        server.close()
        await server.wait_closed()


CHUNK = b'data: {"id":"c","choices":[{"text":"a","finish_reason":null}]}\n\n'
HOSTILE_CASES = {
    "bytes after [DONE]": (CHUNK + b"data: [DONE]\n\n" + CHUNK * 3, "ok"),
    "a 3 MiB line": (CHUNK + b"data: " + b"x" * (3 << 20) + b"\n\n" + b"data: [DONE]\n\n",
                     "fail"),
    "invalid UTF-8": (CHUNK + b"data: \xff\xfe{}\n\n" + b"data: [DONE]\n\n", "fail"),
    "JSON nested 100000 deep": (CHUNK + b"data: " + b"[" * 100_000 + b"\n\n"
                                + b"data: [DONE]\n\n", "fail"),
    "no [DONE], then closed": (CHUNK * 2, "info"),
    "an error event under 200": (CHUNK + b"event: error\ndata: overloaded\n\n", "fail"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CASES))
def test_a_hostile_stream_ends_as_a_recorded_op_with_its_reason(case):
    body, expected = HOSTILE_CASES[case]
    out, took = asyncio.run(_send(Hostile(body)))
    assert out.type == expected, (case, out)
    assert "harness error" not in (out.error or ""), out.error
    json.dumps(out.value)  # recordable
    if case == "bytes after [DONE]":
        assert out.value["stream"]["after_done"] == 3
    if expected == "fail":
        assert out.error, out


def test_a_stream_that_never_ends_is_cut_at_the_timeout():
    out, took = asyncio.run(_send(Hostile(CHUNK, forever=True), timeout_s=1.5))
    assert out.type == "info" and "timeout after 1.5s" in out.error, out
    assert took < 10 and out.value["stream"]["n_chunks"] == 1


@pytest.mark.parametrize("body", [
    b'{"choices": "x"}', b'{"choices": [{"text": 5}]}', b'{"usage": [1]}',
    b'{"usage": {"completion_tokens": "many"}}', b"[" * 100_000, b"\xff", b"[]"])
def test_a_hostile_json_answer_is_a_fail_with_its_reason(body):
    out, _ = asyncio.run(_send(Hostile(body, headers=b"Content-Type: application/json\r\n"),
                               stream=False))
    assert out.type == "fail" and out.error, out
    assert "harness error" not in out.error
