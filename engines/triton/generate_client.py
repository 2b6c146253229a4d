"""The workload's client for a user's Triton model (``--triton-model-repo``):
Triton's generate extension over HTTP, through the router.

  streamed or canary request -> POST /v2/models/NAME/generate_stream, Server-Sent
                                Events, one per response (``f = "generate_stream"``)
  any other request          -> POST /v2/models/NAME/generate (``f = "generate"``)

Why not tritonclient: the generate extension is plain JSON and SSE, and the
harness must see every event as it arrives (its time, an error event, a
stream cut short); load.sse's parser already keeps all of that. A chat turn
is sent as one text: the conversation's messages, oldest first, one
``role: content`` line each, then ``assistant:``, so each turn carries its
history as a chat template would.

Which fields go out is learnt once from the model's own configuration
(``GET /v2/models/NAME/config``): ``text_input`` always; ``stream``,
``max_tokens``, ``temperature`` and ``exclude_input_in_output`` when the
model declares them; ``sampling_parameters`` (the vLLM backend's JSON
string) when it declares that. A model without ``text_input`` or
``text_output`` cannot be driven: every request then fails with that reason
rather than being sent wrong.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from load.client import MAX_BODY, Outcome, Prepared, _latencies, output_hash, read_body
from load.plan import PlannedRequest
from load.spec import WorkloadSpec
from load.sse import SSEParser

#: Optional inputs the client fills when the model declares them.
KNOWN_INPUTS = ("stream", "max_tokens", "temperature", "exclude_input_in_output",
                "sampling_parameters")


def chat_text(req: PlannedRequest) -> str:
    """A chat turn as one text input: its history, then this turn."""
    lines = [f"{m['role']}: {m['content']}" for m in req.messages()]
    return "\n".join([*lines, "assistant:"])


def generate_body(inputs: set[str], req: PlannedRequest, stream: bool) -> dict[str, Any]:
    """The JSON body for a model declaring ``inputs`` (pure)."""
    body: dict[str, Any] = {"text_input": chat_text(req) if req.endpoint == "chat"
                            else req.prompt}
    if "stream" in inputs:
        body["stream"] = stream
    if "max_tokens" in inputs:
        body["max_tokens"] = req.max_tokens
    if "temperature" in inputs:
        body["temperature"] = req.temperature
    if "exclude_input_in_output" in inputs:
        body["exclude_input_in_output"] = True
    if "sampling_parameters" in inputs:
        body["sampling_parameters"] = json.dumps({"max_tokens": req.max_tokens,
                                                  "temperature": req.temperature})
    return body


def model_io(config: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(input names, output names) of a model's configuration JSON."""
    return ({i.get("name") for i in config.get("input", []) if isinstance(i, dict)},
            {o.get("name") for o in config.get("output", []) if isinstance(o, dict)})


class TritonGenerateClient:
    """One pooled aiohttp session to the router; the model's inputs are
    read on the first request."""

    def __init__(self, spec: WorkloadSpec, base_url: str, model: str):
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=spec.max_in_flight))
        self._inputs: set[str] | None = None
        self._unusable: str | None = None
        self._config_error = ""  # why the configuration could not be read, last time
        self._lock = asyncio.Lock()

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared:
        stream = req.stream or req.canary
        f = "generate_stream" if stream else "generate"
        return Prepared(f, {"model": self.model},
                        lambda: self._send(req, request_id, stream))

    async def close(self) -> None:
        await self.session.close()

    async def _learn_inputs(self) -> set[str] | None:
        """The model's declared inputs; None (and ``_unusable`` says why)
        when it cannot be driven. A config that cannot be read now is
        asked for again on the next request."""
        async with self._lock:
            if self._inputs is not None or self._unusable is not None:
                return self._inputs
            url = f"{self.base_url}/v2/models/{self.model}/config"
            try:
                async with self.session.get(url, timeout=aiohttp.ClientTimeout(
                        total=self.spec.timeout_s)) as resp:
                    if resp.status != 200:
                        self._config_error = f"GET {url}: HTTP {resp.status}"
                        return None
                    config = json.loads(await read_body(resp.content, MAX_BODY))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                self._config_error = f"GET {url}: {type(e).__name__}: {e}"
                return None
            inputs, outputs = model_io(config)
            missing = [n for n, have in (("text_input", inputs), ("text_output", outputs))
                       if n not in have]
            if missing:
                self._unusable = (f"model {self.model!r} does not follow the generate convention: "
                                  f"no {' and no '.join(missing)} in its configuration")
                return None
            self._inputs = inputs
            return inputs

    async def _send(self, req: PlannedRequest, request_id: str, stream: bool) -> Outcome:
        inputs = await self._learn_inputs()
        if inputs is None:
            why = self._unusable or (f"its configuration could not be read, so the request "
                                     f"was not sent ({self._config_error})")
            return Outcome("fail", {}, f"{self.model}: {why}")
        path = "generate_stream" if stream else "generate"
        url = f"{self.base_url}/v2/models/{self.model}/{path}"
        start = time.monotonic_ns()
        status = node = None
        times: list[int] = []
        parts: list[str] = []
        try:
            async with self.session.post(
                    url, json=generate_body(inputs, req, stream),
                    headers={"x-request-id": request_id},
                    timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s)) as resp:
                status, node = resp.status, resp.headers.get("x-ordeal-node")
                if status != 200:
                    body = (await resp.content.read(2048)).decode("utf-8", errors="replace")
                    return Outcome("info" if status >= 500 else "fail",
                                   {"status": status, "node": node}, f"HTTP {status}: {body[:300]}")
                if stream:
                    parser = SSEParser()
                    events = []
                    async for chunk in resp.content.iter_any():
                        now = time.monotonic_ns()
                        for ev in parser.feed(chunk):
                            events.append((now, ev))
                    events.extend((time.monotonic_ns(), ev) for ev in parser.close())
                    for at, ev in events:
                        bad = _take(ev.data, parts)
                        if bad:
                            return Outcome("fail", {"status": status, "node": node,
                                                    "output_tokens": len(times)}, bad)
                        times.append(at)
                    if parser.problems:
                        return Outcome("fail", {"status": status, "node": node},
                                       f"malformed stream: {parser.problems[0]}")
                else:
                    raw = await read_body(resp.content, MAX_BODY)
                    times.append(time.monotonic_ns())
                    bad = _take(raw.decode("utf-8", errors="replace"), parts)
                    if bad:
                        return Outcome("fail", {"status": status, "node": node}, bad)
        except aiohttp.ClientConnectorError as e:
            return Outcome("fail", {"node": node}, f"connect failed (request not sent): {e}")
        except asyncio.TimeoutError:
            return Outcome("info", {"status": status, "node": node,
                                    "output_tokens": len(times)},
                           f"timeout after {self.spec.timeout_s}s")
        except (aiohttp.ClientError, ConnectionError, OSError) as e:
            return Outcome("info", {"status": status, "node": node,
                                    "output_tokens": len(times)},
                           f"connection lost: {type(e).__name__}: {e}")
        end = time.monotonic_ns()
        text = "".join(parts)
        # A stream's responses are its tokens as the server sent them; a
        # whole answer's token count is the model's (unknown here).
        tokens = len(times) if stream else None
        value: dict[str, Any] = {"status": status, "node": node, "output_tokens": tokens,
                                 "output_hash": output_hash(text), "output_chars": len(text),
                                 **_latencies(start, end, times if stream else times[:1],
                                              tokens or 0)}
        if req.canary:
            value["text"] = text
        if not text:
            return Outcome("fail", value, "no text_output in the answer")
        return Outcome("ok", value)


def _take(data: str, parts: list[str]) -> str | None:
    """Append one response's ``text_output`` to ``parts``; or say what is
    wrong with it (an error the server sent, or not the convention)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return f"malformed response (not JSON): {data[:200]!r}"
    if not isinstance(obj, dict):
        return f"malformed response (not an object): {data[:200]!r}"
    if "error" in obj:
        return f"error from the server: {str(obj['error'])[:300]}"
    text = obj.get("text_output")
    if isinstance(text, list):  # a [1]-shaped output may come as a list
        text = "".join(str(t) for t in text)
    if not isinstance(text, str):
        return f"no text_output in the response: {data[:200]!r}"
    parts.append(text)
    return None
