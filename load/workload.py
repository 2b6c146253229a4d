"""The workload: seeded request plans (pure) and an async client that sends
them and records every request in the history (thin adapter).

Arrivals follow ``vllm bench serve``: open loop with gamma-distributed gaps
of mean 1/rate (shape = burstiness; 1.0 is Poisson), or closed loop with a
fixed number of concurrent clients. Each request is its own history process
(open loop) or belongs to its client (closed loop), so every process has at
most one request in flight, which is what the checkers pair on.

Classification (Jepsen's rule: ``fail`` only when the request certainly did
not take effect or the server said it failed):
  connection refused before sending ........ fail
  HTTP 4xx (rejected before running) ....... fail
  HTTP 5xx ................................. info (a router's 500 "error sending
                                             request" after its upstream died may
                                             come after the replica took the work)
  error event in a stream (even under 200) . fail
  malformed SSE data / malformed JSON body . fail
  timeout, connection lost, no [DONE] ...... info (it may have run)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Literal, Protocol

import aiohttp

from faults.base import FaultError
from faults.safety import require_ours
from load.sse import SSEParser, StreamRecorder
from ordeal.config import ConfigError
from ordeal.history.writer import History, HistoryWriteError
from ordeal.topology import Endpoint as Address

Endpoint = Literal["completions", "chat"]
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
WORDS = ("the cluster replica router token stream fault heal latency packet clock model "
         "server queue batch cache memory process restart health prompt answer quick brown "
         "fox jumps over lazy dog alpha beta gamma delta").split()
CANARY_PROMPTS = ("the quick brown fox jumps over", "alpha beta gamma delta", "router replica health")


@dataclass(frozen=True)
class WorkloadSpec:
    """Every knob of the load, seeded: the same spec gives the same requests."""

    model: str = "ordeal-tiny"
    duration_s: float = 30.0
    mode: Literal["open", "closed"] = "open"
    rate: float = 8.0  # requests/s (open loop)
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, <1 burstier, >1 steadier
    concurrency: int = 4  # clients (closed loop); also the open-loop cap
    seed: int = 0
    prompt_words: tuple[int, int] = (4, 32)
    max_tokens: tuple[int, int] = (8, 32)
    stream_share: float = 0.8  # share of requests that stream
    chat_share: float = 0.3  # share of requests sent to /v1/chat/completions
    canary_every: int = 10  # every n-th request is a greedy canary (0: none)
    temperature: float = 0.7
    timeout_s: float = 30.0
    max_in_flight: int = 256  # open loop: past this, arrivals wait (recorded)
    # vLLM's extension: token ids in every chunk, so usage can be checked
    # against the tokens really streamed (chunks merge tokens under load).
    return_token_ids: bool = True

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ConfigError("workload duration must be more than zero seconds")
        if self.mode not in ("open", "closed"):
            raise ConfigError(f"workload mode {self.mode!r}: use 'open' or 'closed'")
        if self.mode == "open" and self.rate <= 0:
            raise ConfigError(f"workload rate {self.rate}: must be more than zero requests/s")
        if self.burstiness <= 0:
            raise ConfigError(f"burstiness {self.burstiness}: must be more than zero")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency {self.concurrency}: must be at least 1")
        for name, (lo, hi) in (("prompt_words", self.prompt_words), ("max_tokens", self.max_tokens)):
            if not 1 <= lo <= hi:
                raise ConfigError(f"{name} range {(lo, hi)}: need 1 <= low <= high")
        for name in ("stream_share", "chat_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} {getattr(self, name)}: must be within 0..1")


@dataclass(frozen=True)
class PlannedRequest:
    seq: int
    at_s: float  # offset from the start of the load (open loop; 0 in closed)
    endpoint: Endpoint
    stream: bool
    prompt: str
    max_tokens: int
    temperature: float
    canary: bool

    def body(self, model: str, return_token_ids: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": self.stream}
        if return_token_ids:
            body["return_token_ids"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            # continuous usage: each chunk carries the running completion_tokens,
            # the stream's sequence number (load.sse checks it).
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body


def plan_requests(spec: WorkloadSpec, limit_s: float | None = None) -> Iterator[PlannedRequest]:
    """The request plan: pure, seeded and endless; with ``limit_s`` an open
    loop plan stops at that offset. The runner decides when to stop."""
    rng = random.Random(spec.seed)
    at = 0.0
    seq = 0
    while True:
        if spec.mode == "open":
            at += rng.gammavariate(spec.burstiness, 1.0 / (spec.rate * spec.burstiness))
            if limit_s is not None and at >= limit_s:
                return
        canary = spec.canary_every > 0 and seq % spec.canary_every == 0
        if canary:
            prompt = CANARY_PROMPTS[(seq // spec.canary_every) % len(CANARY_PROMPTS)]
            req = PlannedRequest(seq, at, "completions", True, prompt, 16, 0.0, True)
        else:
            words = rng.randint(*spec.prompt_words)
            req = PlannedRequest(
                seq, at,
                "chat" if rng.random() < spec.chat_share else "completions",
                rng.random() < spec.stream_share,
                " ".join(rng.choice(WORDS) for _ in range(words)),
                rng.randint(*spec.max_tokens),
                spec.temperature, False)
        yield req
        seq += 1


def output_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


@dataclass
class Outcome:
    type: Literal["ok", "fail", "info"]
    value: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _latencies(start_ns: int, end_ns: int, times: list[int], tokens: int) -> dict[str, Any]:
    """TTFT, ITL, TPOT and E2E exactly as ``vllm bench serve`` defines them."""
    out: dict[str, Any] = {"e2e_ms": round((end_ns - start_ns) / 1e6, 3)}
    if times:
        out["ttft_ms"] = round((times[0] - start_ns) / 1e6, 3)
        out["itl_ms"] = [round((b - a) / 1e6, 3) for a, b in zip(times, times[1:])]
        if tokens > 1:
            out["tpot_ms"] = round((end_ns - times[0]) / 1e6 / (tokens - 1), 3)
    return out


MAX_BODY = 8 << 20  # a non-streamed answer larger than this is a server fault


async def read_body(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body, up to ``limit`` bytes. ``StreamReader.read(n)``
    returns what has arrived so far, not n bytes: on a slow link (seen under
    bandwidth_limit) one read gave half a JSON body, which the harness then
    blamed on the server."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await content.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def answer_shape(payload: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]] | str:
    """A non-streamed answer's first choice, its text and its usage, or
    what is wrong with the shape (the harness records it as a ``fail``; a
    hostile body must not end up as a harness error)."""
    choices = payload.get("choices")
    if choices is None:
        choices = [{}]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return f"choices is not a list of objects ({type(choices).__name__})"
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        message = choice.get("message") or {}
        text = message.get("content") if isinstance(message, dict) else None
    if text is None:
        text = ""
    if not isinstance(text, str):
        return f"the answer's text is a {type(text).__name__}, not a string"
    usage = payload.get("usage") or {}
    if not isinstance(usage, dict):
        return f"usage is a {type(usage).__name__}, not an object"
    tokens = usage.get("completion_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)
                               or tokens < 0):
        return f"usage.completion_tokens is not a count: {tokens!r:.80}"
    return choice, text, usage


async def send_request(session: aiohttp.ClientSession, base_url: str, req: PlannedRequest,
                       model: str, timeout_s: float, return_token_ids: bool = False,
                       request_id: str | None = None) -> Outcome:
    """Send one request and classify what happened. Never raises for anything
    the server or the network does; only cancellation propagates.

    ``request_id`` goes out as ``x-request-id``; routers forward it and each
    replica's served journal records it, which is how a router's retry (one
    client request, two executions) becomes visible."""
    url = base_url + PATHS[req.endpoint]
    start = time.monotonic_ns()
    node = None
    status = None
    recorder = StreamRecorder(start)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        headers = {"x-request-id": request_id} if request_id else None
        async with session.post(url, json=req.body(model, return_token_ids),
                                timeout=timeout, headers=headers) as resp:
            status = resp.status
            node = resp.headers.get("x-ordeal-node")
            if status != 200:
                body = (await resp.content.read(2048)).decode("utf-8", errors="replace")
                kind = "info" if status >= 500 else "fail"
                return Outcome(kind, {"status": status, "node": node},
                               f"HTTP {status}: {body[:300]}")
            if req.stream:
                parser = SSEParser()
                async for chunk in resp.content.iter_any():
                    now = time.monotonic_ns()
                    for ev in parser.feed(chunk):
                        recorder.on_event(ev, now)
                for ev in parser.close():
                    recorder.on_event(ev)
                recorder.add_problems(parser.problems)
            else:
                raw = await read_body(resp.content, MAX_BODY)
                first = time.monotonic_ns()
                if len(raw) > MAX_BODY:
                    return Outcome("fail", {"status": status, "node": node},
                                   f"body larger than {MAX_BODY >> 20} MiB: not an answer")
                try:
                    payload = json.loads(raw)
                    if not isinstance(payload, dict):
                        raise ValueError("top level is not an object")
                except (ValueError, RecursionError) as e:  # nested too deep: Recursion
                    return Outcome("fail", {"status": status, "node": node},
                                   f"malformed JSON body ({type(e).__name__}: {e}): "
                                   f"{raw[:200]!r}")
                if "error" in payload:
                    return Outcome("fail", {"status": status, "node": node},
                                   f"error body under HTTP 200: {str(payload['error'])[:300]}")
                shape = answer_shape(payload)
                if isinstance(shape, str):
                    return Outcome("fail", {"status": status, "node": node},
                                   f"malformed answer: {shape}: {raw[:200]!r}")
                choice, text, usage = shape
                tokens = usage.get("completion_tokens") or 0
                end = time.monotonic_ns()
                value = {"status": status, "node": node, "id": payload.get("id"),
                         "finish_reason": choice.get("finish_reason"), "usage": usage,
                         "output_tokens": tokens, "output_hash": output_hash(text),
                         "fingerprint": payload.get("system_fingerprint"),
                         "created": payload.get("created"),
                         **_latencies(start, end, [first], tokens)}
                if req.canary:
                    value["text"] = text
                    if isinstance(choice.get("token_ids"), list):
                        value["token_ids"] = choice["token_ids"]
                return Outcome("ok", value)
    except aiohttp.ClientConnectorError as e:
        return Outcome("fail", {"node": node}, f"connect failed (request not sent): {e}")
    except asyncio.TimeoutError:
        kind = "stream" if recorder.record.chunks else "response"
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value() if req.stream else None},
                       f"timeout after {timeout_s}s waiting for the {kind}")
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value() if req.stream else None},
                       f"connection lost: {type(e).__name__}: {e}")

    end = time.monotonic_ns()
    rec = recorder.record
    usage = rec.usage or {}
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        if tokens is not None:
            recorder.add_problems([f"usage.completion_tokens is not a count: {tokens!r:.80}"])
        tokens = len(rec.token_times_ns)
    value = {"status": status, "node": node, "id": rec.ids[0] if rec.ids else None,
             "finish_reason": rec.finish_reasons[-1] if rec.finish_reasons else None,
             "usage": rec.usage, "output_tokens": tokens, "output_hash": output_hash(rec.text),
             "fingerprint": rec.system_fingerprint, "created": rec.created,
             "stream": rec.to_value(),
             **_latencies(start, end, rec.token_times_ns, tokens)}
    if req.canary:
        value["text"] = rec.text
        if rec.token_ids_seen:
            value["token_ids"] = rec.token_ids
    if rec.errors:
        return Outcome("fail", value, f"error event in stream: {rec.errors[0][:300]}")
    if rec.malformed:
        return Outcome("fail", value, f"malformed stream: {rec.malformed[0]}")
    if not rec.done:
        return Outcome("info", value, "stream ended without [DONE]")
    return Outcome("ok", value)


Progress = Callable[[str], None]


def url_endpoint(url: str) -> Address:
    """The host and port a base URL sends to (default ports by scheme)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FaultError(f"load: {url!r} is not an http(s) URL with a host")
    return Address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


@dataclass
class Prepared:
    """A request made concrete for one engine: the history op name ``f``,
    what the invoke op records beyond the plan, and the call itself."""

    f: str
    invoke: dict[str, Any]
    call: Callable[[], Awaitable[Outcome]]


class EngineClient(Protocol):
    """The workload's side of an engine. ``prepare`` is synchronous so the
    invoke op is written before anything is sent; ``close`` ends pools."""

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared: ...

    async def close(self) -> None: ...


class OpenAIClient:
    """The OpenAI API (vLLM, or any engine that speaks it) over one pooled
    aiohttp session: the default EngineClient."""

    def __init__(self, spec: WorkloadSpec, base_url: str):
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=spec.max_in_flight, force_close=False))

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared:
        return Prepared(req.endpoint, {}, lambda: send_request(
            self.session, self.base_url, req, self.spec.model, self.spec.timeout_s,
            self.spec.return_token_ids, request_id))

    async def close(self) -> None:
        await self.session.close()


class WorkloadRunner:
    """Drives a plan against ``base_url`` and records it in ``history``.
    ``client`` makes each planned request concrete for the engine (a
    callable returning an EngineClient, called inside the event loop);
    by default the OpenAI API at ``base_url``."""

    def __init__(self, spec: WorkloadSpec, base_url: str, history: History,
                 progress: Progress | None = None, progress_every_s: float = 5.0,
                 client: Callable[[], EngineClient] | None = None):
        self.make_client = client or (lambda: OpenAIClient(spec, base_url))
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        require_ours(url_endpoint(self.base_url), "load")  # before any request is sent
        self.history = history
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.in_flight = 0
        self.history_failure: HistoryWriteError | None = None
        self._stop = asyncio.Event()
        # Request ids are unique across runs: journals outlive a run.
        self.rid_prefix = f"ordeal-{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        """Stop sending new requests; those in flight still complete."""
        self._stop.set()

    async def _one(self, client: Any, process: int | str, req: PlannedRequest) -> None:
        try:
            await self._one_recorded(client, process, req)
        except HistoryWriteError as e:
            # Nothing from here on would be recorded: stop sending, and let
            # run() raise it once what is in flight has ended.
            if self.history_failure is None:
                self.history_failure = e
                if self.progress:
                    self.progress(f"load: stopping, the history cannot be written: {e}")
            self.stop()

    async def _one_recorded(self, client: Any, process: int | str,
                            req: PlannedRequest) -> None:
        rid = f"{self.rid_prefix}-{req.seq}"
        prepared = client.prepare(req, rid)
        f = prepared.f
        self.history.append("invoke", process, f, {
            "seq": req.seq, "stream": req.stream, "max_tokens": req.max_tokens,
            "prompt": req.prompt, "temperature": req.temperature, "canary": req.canary,
            "request_id": rid, **prepared.invoke})
        self.in_flight += 1
        try:
            outcome = await prepared.call()
        except asyncio.CancelledError:
            self.history.append("info", process, f, {"seq": req.seq},
                                "cancelled by the harness before an answer")
            raise
        except Exception as e:  # noqa: BLE001 - a harness bug must not lose the op
            outcome = Outcome("info", {}, f"harness error: {type(e).__name__}: {e}")
        finally:
            self.in_flight -= 1
        self.history.append(outcome.type, process, f,
                            {"seq": req.seq, **outcome.value}, outcome.error)

    async def _report(self, t0: float) -> None:
        while True:
            await asyncio.sleep(self.progress_every_s)
            c = self.history.counts
            if self.progress:
                self.progress(f"load {time.monotonic() - t0:5.0f}s/{self.spec.duration_s:.0f}s: "
                              f"invoked {c['invoke']} ok {c['ok']} fail {c['fail']} "
                              f"info {c['info']} in flight {self.in_flight}")

    async def run(self, until: Callable[[], bool] | None = None,
                  max_s: float | None = None) -> None:
        """Run for ``duration_s``, and on past it while ``until`` says False
        (e.g. a fault has not healed yet), but never past ``max_s``."""
        t0 = time.monotonic()
        hard_stop = t0 + (max_s if max_s is not None else self.spec.duration_s)

        def over() -> bool:
            now = time.monotonic()
            if self._stop.is_set() or now >= hard_stop:
                return True
            return now - t0 >= self.spec.duration_s and (until is None or until())

        reporter = asyncio.create_task(self._report(t0))
        client = self.make_client()
        try:
            if self.spec.mode == "closed":
                await self._closed(client, over)
            else:
                await self._open(client, t0, over)
        finally:
            reporter.cancel()
            await client.close()
        if self.history_failure is not None:
            raise self.history_failure

    async def _open(self, client: Any, t0: float, over: Callable[[], bool]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        sem = asyncio.Semaphore(self.spec.max_in_flight)

        async def bounded(req: PlannedRequest) -> None:
            async with sem:
                await self._one(client, req.seq, req)

        try:
            for req in plan_requests(self.spec):
                delay = t0 + req.at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if over():
                    break
                task = asyncio.create_task(bounded(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()

    async def _closed(self, client: Any, over: Callable[[], bool]) -> None:
        plan = plan_requests(self.spec)

        async def loop(cid: int) -> None:
            while not over():
                await self._one(client, f"c{cid}", next(plan))

        await asyncio.gather(*(loop(i) for i in range(self.spec.concurrency)))
