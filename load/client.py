"""The OpenAI HTTP client (thin adapter): sends one planned request to the
router, reads its answer or its stream (load/sse.py), and classifies the
outcome for the history.

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
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Protocol

import aiohttp

from load.plan import PlannedRequest
from load.spec import PATHS, WorkloadSpec
from load.sse import SSEParser, StreamRecorder
from ordeal.config import ConfigError
from ordeal.networks import NotOurs
from ordeal.topology import Endpoint as Address


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


NODE_HEADER = "x-ordeal-node"  # what Ordeal's own replicas add (engines/vllm/node_header.py)


def _ordeal_node(headers: Any) -> str | None:
    return headers.get(NODE_HEADER)


async def send_request(session: aiohttp.ClientSession, base_url: str, req: PlannedRequest,
                       model: str, timeout_s: float, return_token_ids: bool = False,
                       request_id: str | None = None,
                       post_kwargs: dict[str, Any] | None = None,
                       node_of: Callable[[Any], str | None] | None = None) -> Outcome:
    """Send one request and classify what happened. Never raises for anything
    the server or the network does; only cancellation propagates.

    ``node_of``: which replica answered, from the response headers
    (``ClientOptions.node_of``); by default Ordeal's own ``x-ordeal-node``.

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
                                timeout=timeout, headers=headers,
                                **(post_kwargs or {})) as resp:
            status = resp.status
            node = (node_of or _ordeal_node)(resp.headers)
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
        kind = "stream" if recorder.record.n_chunks else "response"
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value(start) if req.stream else None},
                       f"timeout after {timeout_s}s waiting for the {kind}")
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value(start) if req.stream else None},
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
        # The body ended in good order (a transport error is caught above):
        # the server closed the stream itself, and stream_wellformed judges it.
        value["stream"]["clean_eof"] = True
        return Outcome("info", value, "stream ended without [DONE]")
    return Outcome("ok", value)


def plan_extras(req: PlannedRequest) -> dict[str, Any]:
    """What the invoke op records of the newer plan fields, only when set
    (a plain request's invoke op is what it always was)."""
    out: dict[str, Any] = {}
    if req.conversation is not None:
        out["conversation"] = req.conversation
        out["turn"] = req.turn
    if req.prefix_group is not None:
        out["prefix_group"] = req.prefix_group
    return out


def url_endpoint(url: str) -> Address:
    """The host and port a base URL sends to (default ports by scheme)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotOurs(f"load: {url!r} is not an http(s) URL with a host")
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


@dataclass(frozen=True)
class ClientOptions:
    """How to reach a deployment Ordeal did not start (ordeal/target.py):
    extra headers, the API key's environment variable (read when the
    client is made, held only in its session's headers, never written),
    TLS verification or a CA file, and the TLS server name when the
    connection goes through the fault proxy on loopback."""

    headers: tuple[tuple[str, str], ...] = ()
    api_key_env: str | None = None
    verify: bool = True
    ca_file: str | None = None
    server_hostname: str | None = None
    host_header: str | None = None  # the deployment's own name, through the proxy
    follow_redirects: bool = True  # False: a redirect to an unchecked host is not followed
    #: The response header naming the replica that answered (the target
    #: file's ``replica_header``), and which value means which replica
    #: (value -> name: each replica's name, its URL's ``host:port`` and its
    #: ``served_as`` values). A value no replica claims is no node (the
    #: checkers count the answer as unplaced), never a guess.
    node_header: str = NODE_HEADER
    node_names: tuple[tuple[str, str], ...] = ()

    def node_of(self, headers: Any) -> str | None:
        value = headers.get(self.node_header)
        if value is None or not self.node_names:
            return value
        return dict(self.node_names).get(value.strip())

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def session_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.host_header:
            out["Host"] = self.host_header
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ConfigError(f"the target file's api_key_env names {self.api_key_env}, "
                                  "which is not set (or empty) in the environment; export it "
                                  "before the run")
            out["Authorization"] = f"Bearer {key}"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same for urllib (health, metrics): None is the system's CAs."""
        if not self.verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    def ssl(self) -> Any:
        """What aiohttp's ``ssl=`` takes: False (no verification), a context
        with the CA file, or True (the system's CAs)."""
        if not self.verify:
            return False
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return True


def scrubbed(outcome: Outcome, secret: str) -> Outcome:
    """``outcome`` with ``secret`` replaced wherever it appears (the error,
    any string value): never in the history, whatever the server echoed."""
    text = json.dumps(outcome.value, default=str)
    if secret not in (outcome.error or "") and secret not in text:
        return outcome
    value = json.loads(text.replace(secret, "<redacted>"))
    error = outcome.error.replace(secret, "<redacted>") if outcome.error else outcome.error
    return Outcome(outcome.type, value, error)


class OpenAIClient:
    """The OpenAI API (vLLM, or any engine that speaks it) over one pooled
    aiohttp session: the default EngineClient."""

    def __init__(self, spec: WorkloadSpec, base_url: str, options: ClientOptions | None = None):
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        options = options or ClientOptions()
        self.node_of = options.node_of
        self.post_kwargs: dict[str, Any] = {}
        if not options.follow_redirects:
            self.post_kwargs["allow_redirects"] = False
        # Held in memory only, to scrub from what the server says back (an
        # error page that echoes the request) before the history has it.
        self.secret = options.api_key()
        if self.base_url.startswith("https:"):
            self.post_kwargs["ssl"] = options.ssl()
            if options.server_hostname:
                self.post_kwargs["server_hostname"] = options.server_hostname
        self.session = aiohttp.ClientSession(
            headers=options.session_headers(),
            connector=aiohttp.TCPConnector(limit=spec.max_in_flight, force_close=False))

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared:
        async def call() -> Outcome:
            out = await send_request(self.session, self.base_url, req, self.spec.model,
                                     self.spec.timeout_s, self.spec.return_token_ids,
                                     request_id, self.post_kwargs, self.node_of)
            return scrubbed(out, self.secret) if self.secret else out
        return Prepared(req.endpoint, {}, call)

    async def close(self) -> None:
        await self.session.close()
