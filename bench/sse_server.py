"""A minimal OpenAI-style SSE server that is cheap enough not to be the
bottleneck when a load generator is measured (bench/bench_load.py), and a
real process for the fault-effect bench (bench/bench_faults.py).

    python bench/sse_server.py --port P [--itl-ms 10] [--tokens N] [--cpu C] [--reuse-port]
                               [--phases arrival|random] [--seed S]

Raw asyncio protocol (uvloop when importable), HTTP/1.1 keep-alive, chunked
transfer like vLLM's server. Every stream gets a token every ``--itl-ms`` from
its arrival (1 ms tick), so many streams' tokens are spread in time. With
``--phases random`` a stream's first token comes a random 0 to ``--itl-ms``
after its arrival instead (seeded): the server, not the client's start-up,
decides how the streams' tokens spread over the ITL, so two clients under a
closed loop meet the same spread (bench/results/notes.md, 2026-12-05: at 1,024
streams one client's first wave left its streams' tokens in one 15 ms burst
per 50 ms, the other's in two). Each chunk's
text is the server's CLOCK_MONOTONIC time in ns when it was written, so a
client on the same machine can tell how late it recorded the chunk.

Routes: ``GET /health`` (200 ok), ``GET /v1/models``, ``POST
/v1/completions`` (stream true or false; ``max_tokens`` tokens unless
``--tokens`` forces a count). Anything else: 404. Prints ``READY <port>``
on stdout once listening; ``SIGTERM`` ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time

MODEL = "ordeal-tiny"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stream:
    __slots__ = ("transport", "left", "sent", "rid", "created", "prompt_tokens")

    def __init__(self, transport: asyncio.Transport, tokens: int, rid: str, prompt_tokens: int):
        self.transport = transport
        self.left = tokens
        self.sent = 0
        self.rid = rid
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens


class Engine:
    """Every stream gets a token every ``itl`` seconds from its arrival, on
    a 1 ms tick (streams are spread over the tick, as a real server's
    serialisation spreads them). Bucketed by tick: O(1) work per chunk."""

    TICK_S = 0.001

    def __init__(self, itl_s: float, random_phases: bool = False, seed: int = 0):
        self.itl_ticks = max(1, round(itl_s / self.TICK_S))
        self.phase = random.Random(seed) if random_phases else None
        self.buckets: dict[int, list[Stream]] = {}
        self.tick = 0
        self.t0 = 0.0
        self.steps = 0
        self.chunks = 0
        self.running = 0
        self.max_running = 0
        self.late_ticks = 0
        self.wake = asyncio.Event()

    def add(self, s: Stream) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        delay = 1 + (self.phase.randrange(self.itl_ticks) if self.phase else 0)
        self.buckets.setdefault(self.tick + delay, []).append(s)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        while True:
            if not self.buckets:  # idle: no tick costs CPU until a stream comes
                self.wake.clear()
                await self.wake.wait()
                self.t0 = loop.time() - self.tick * self.TICK_S
            due = int((loop.time() - self.t0) / self.TICK_S)
            if due > self.tick + 1:
                self.late_ticks += due - self.tick - 1
            while self.tick < due:
                self.tick += 1
                bucket = self.buckets.pop(self.tick, None)
                if bucket:
                    self.step(bucket)
            await asyncio.sleep(self.t0 + (self.tick + 1) * self.TICK_S - loop.time())

    def step(self, bucket: list[Stream]) -> None:
        self.steps += 1
        again = self.buckets.setdefault(self.tick + self.itl_ticks, [])
        mono = time.monotonic_ns
        for s in bucket:
            t = s.transport
            if t.is_closing():
                self.running -= 1
                continue
            s.sent += 1
            s.left -= 1
            last = s.left <= 0
            body = ('data: {"id":"%s","object":"text_completion","created":%d,"model":"%s",'
                    '"choices":[{"index":0,"text":"%d ","token_ids":[%d],"logprobs":null,'
                    '"finish_reason":%s,"stop_reason":null}],"usage":{"prompt_tokens":%d,'
                    '"total_tokens":%d,"completion_tokens":%d}}\n\n'
                    % (s.rid, s.created, MODEL, mono(), 100 + s.sent % 1000,
                       '"length"' if last else "null", s.prompt_tokens,
                       s.prompt_tokens + s.sent, s.sent)).encode()
            self.chunks += 1
            if last:
                usage = ('data: {"id":"%s","object":"text_completion","created":%d,"model":"%s",'
                         '"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,'
                         '"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
                         % (s.rid, s.created, MODEL, s.prompt_tokens,
                            s.prompt_tokens + s.sent, s.sent)).encode()
                t.write(chunk(body) + chunk(usage) + b"0\r\n\r\n")
                self.running -= 1
            else:
                t.write(chunk(body))
                again.append(s)


class Http(asyncio.Protocol):
    engine: Engine
    forced_tokens: int | None = None
    serial = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = (lines[0].split(" ") + ["", "", ""])[:3]
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.handle(method, path, body)

    def reply(self, status: str, body: bytes, ctype: str = "application/json") -> None:
        self.t.write(b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                     % (status.encode(), ctype.encode(), len(body), body))

    def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/health":
            return self.reply("200 OK", b"", "text/plain")
        if method == "GET" and path == "/v1/models":
            return self.reply("200 OK", json.dumps(
                {"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        if method != "POST" or path != "/v1/completions":
            return self.reply("404 Not Found", b'{"error":"not found"}')
        try:
            req = json.loads(body)
        except ValueError:
            return self.reply("400 Bad Request", b'{"error":"bad json"}')
        tokens = self.forced_tokens or int(req.get("max_tokens") or 16)
        Http.serial += 1
        rid = f"cmpl-bench-{Http.serial}"
        prompt = req.get("prompt")
        ptoks = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        if not req.get("stream"):
            text = " ".join(str(time.monotonic_ns()) for _ in range(tokens))
            return self.reply("200 OK", json.dumps({
                "id": rid, "object": "text_completion", "created": int(time.time()),
                "model": MODEL, "choices": [{"index": 0, "text": text,
                                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": ptoks, "completion_tokens": tokens,
                          "total_tokens": ptoks + tokens}}).encode())
        self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        self.engine.add(Stream(self.t, tokens, rid, ptoks))


async def serve(port: int, host: str, itl_s: float, reuse_port: bool = False,
                random_phases: bool = False, seed: int = 0) -> None:
    loop = asyncio.get_running_loop()
    engine = Engine(itl_s, random_phases, seed)
    Http.engine = engine
    server = await loop.create_server(Http, host, port, backlog=4096, reuse_address=True,
                                      reuse_port=reuse_port or None)
    task = asyncio.create_task(engine.run())
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    await stop.wait()
    task.cancel()
    server.close()
    print(json.dumps({"steps": engine.steps, "chunks": engine.chunks,
                      "max_running": engine.max_running, "late_ticks": engine.late_ticks}),
          flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=None, help="force this many tokens per stream")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--phases", choices=["arrival", "random"], default="arrival",
                    help="when a stream's tokens come: every --itl-ms from its arrival "
                         "(default), or from a random 0 to --itl-ms after it")
    ap.add_argument("--seed", type=int, default=0, help="for --phases random")
    ap.add_argument("--reuse-port", action="store_true",
                    help="SO_REUSEPORT: several servers on one port share the connections "
                         "(bench/bench_workers.py, so the server is not the limit)")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    Http.forced_tokens = args.tokens
    try:
        import uvloop  # type: ignore[import-not-found]
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.host, args.itl_ms / 1000, args.reuse_port,
                      args.phases == "random", args.seed))


if __name__ == "__main__":
    sys.exit(main())
