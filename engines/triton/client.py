"""The workload's client for a Triton cluster, with ``tritonclient``.

The same seeded plan as for vLLM (load.plan.plan_requests) becomes
Triton calls, all through the router's one port:

  streamed or canary request -> gRPC streaming on the decoupled model
                                (``f = "generate_stream"``, one response per token)
  other completion request   -> HTTP infer on ``ordeal-tiny-once`` (``f = "infer"``)
  chat-share request         -> the next step of a correlated sequence on the
                                stateful model (``f = "sequence"``, HTTP)

Sequences: a few live at a time; each step carries its position and a value,
and is sent only when the previous step of that sequence has its answer
(Triton keeps the state; a step sent early would race it). A sequence whose
step failed or was lost is abandoned (its state is then unknown); a new one
takes its place. The invoke op records what the client sends: sequence id,
step, START/END, value. ``invariants.sequence`` judges the answers.

A sequence jump (faults/sequence_jump.py) is applied here, between the
recorded invoke and the wire, the way the proxy's lsn_jump rewrites a
stream between the server and the client: the history keeps what the client
meant, and only the server's answers can reveal what arrived.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.triton.haproxy import SEQUENCE_HEADER
from engines.triton.models import GENERATE_MODEL, ONCE_MODEL, SEQUENCE_MODEL
from engines.triton.pytriton import send_generate
from load.client import Outcome, Prepared, _latencies, output_hash
from load.plan import PlannedRequest
from load.spec import WorkloadSpec

JUMP_MODES = ("skip", "repeat", "restart")


@dataclass
class Step:
    sequence_id: int
    step: int
    start: bool
    end: bool
    value: int


@dataclass
class _Live:
    sequence_id: int
    length: int
    next_step: int = 0
    busy: bool = False


class SequencePlanner:
    """Which step goes next (pure but for its seeded rng). At most
    ``max_live`` sequences are open; a request takes a sequence that has no
    step in flight, or opens a new one."""

    def __init__(self, seed: int, max_live: int = 4, length: tuple[int, int] = (3, 8),
                 first_id: int | None = None):
        self.rng = random.Random(seed)
        # Correlation ids are unique across runs (sequences outlive nothing,
        # but a replica restarted mid-run must not see an old id reused).
        self.next_id = first_id if first_id is not None else (
            (int(time.time() * 1000) % 10**9) * 1000 + 1)
        self.max_live = max_live
        self.length = length
        self.live: list[_Live] = []

    def take(self) -> Step:
        free = [s for s in self.live if not s.busy]
        if free and (len(self.live) >= self.max_live or self.rng.random() < 0.7):
            seq = self.rng.choice(free)
        else:
            seq = _Live(self.next_id, self.rng.randint(*self.length))
            self.next_id += 1
            self.live.append(seq)
        seq.busy = True
        return Step(seq.sequence_id, seq.next_step, seq.next_step == 0,
                    seq.next_step == seq.length - 1, self.rng.randint(1, 100))

    def done(self, step: Step, ok: bool) -> None:
        """The answer came: advance, finish, or abandon the sequence."""
        for seq in self.live:
            if seq.sequence_id == step.sequence_id:
                seq.busy = False
                seq.next_step += 1
                if not ok or step.end:
                    self.live.remove(seq)
                return


class JumpControl:
    """Reads the sequence-jump fault's control file (absent = no fault).
    The file names a mode and how many steps to jump; each window (``id``)
    jumps that many steps, then none until the next window."""

    def __init__(self, path: Path | None):
        self.path = path
        self.used: dict[str, int] = {}

    def next_jump(self) -> str | None:
        if self.path is None:
            return None
        try:
            d = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # no fault now (or a half-written file: the next step looks again)
        wid, count = str(d.get("id")), int(d.get("count", 1))
        if self.used.get(wid, 0) >= count or d.get("mode") not in JUMP_MODES:
            return None
        self.used[wid] = self.used.get(wid, 0) + 1
        self._record(wid)
        return str(d["mode"])

    def _record(self, wid: str) -> None:
        """How many jumped steps this client put on the wire for window
        ``wid``, beside the control file (``faults.sequence_jump.sent_path``):
        the fault's evidence that it acted, as a toxic counts its hits."""
        assert self.path is not None
        sent = self.path.with_suffix(".sent")
        tmp = self.path.with_suffix(".sent.tmp")
        try:
            tmp.write_text(json.dumps({"id": wid, "sent": self.used[wid]}))
            os.replace(tmp, sent)
        except OSError:
            pass  # no evidence then: fault_effective says so


def jumped(step: Step, mode: str | None) -> Step:
    """What arrives at the server when ``mode`` hits ``step``: skip = the
    position after it, repeat = the position before it again, restart = a
    second START for the live sequence."""
    if mode == "skip":
        return Step(step.sequence_id, step.step + 1, False, step.end, step.value)
    if mode == "repeat" and step.step > 0:
        return Step(step.sequence_id, step.step - 1, False, step.end, step.value)
    if mode == "restart" and step.step > 0:
        return Step(step.sequence_id, 0, True, False, step.value)
    return step


def node_of(result: Any) -> str | None:
    """The replica that answered: the models' ``node`` output."""
    try:
        out = result.as_numpy("node")
        if out is None or not out.size:
            return None
        v = out.reshape(-1)[0]
        return (v.decode() if isinstance(v, bytes) else str(v)) or None
    except Exception:  # noqa: BLE001 - an answer without it stays an answer
        return None


class TritonClient:
    """tritonclient over HTTP and gRPC, one router address for both."""

    def __init__(self, spec: WorkloadSpec, entry: str, jump_file: Path | None = None):
        import tritonclient.http.aio as httpclient

        self.spec = spec
        self.entry = entry  # host:port of the router (or its client link)
        self.http = httpclient.InferenceServerClient(url=entry, conn_limit=spec.max_in_flight,
                                                     conn_timeout=spec.timeout_s)
        self.sequences = SequencePlanner(spec.seed)
        self.jumps = JumpControl(jump_file)
        self.sequence_model = SEQUENCE_MODEL

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared:
        if req.canary or (req.stream and req.endpoint != "chat"):
            return Prepared("generate_stream", {"model": GENERATE_MODEL},
                            lambda: self._generate(req, request_id))
        if req.endpoint == "chat":
            step = self.sequences.take()
            return Prepared("sequence", {"model": self.sequence_model,
                                         "sequence_id": step.sequence_id,
                                         "step": step.step, "start": step.start,
                                         "end": step.end, "value": step.value},
                            lambda: self._sequence(step, request_id))
        return Prepared("infer", {"model": ONCE_MODEL},
                        lambda: self._infer(req, request_id))

    async def close(self) -> None:
        await self.http.close()

    async def _generate(self, req: PlannedRequest, request_id: str) -> Outcome:
        out = await send_generate(self.entry, req.prompt, req.max_tokens, req.temperature,
                                  self.spec.timeout_s, model=GENERATE_MODEL,
                                  request_id=request_id, with_node=True)
        ids = out.value.get("token_ids")
        if out.type == "ok" and ids is not None:
            # The model's tokens are bytes: its text, for the determinism canaries.
            out.value["text"] = bytes(i for i in ids if 0 <= i < 256).decode("latin-1")
        return out

    async def _call(self, model: str, inputs: list[Any], request_id: str,
                    **kw: Any) -> tuple[Any, Outcome | None]:
        """One HTTP infer; (result, None) or (None, the classified failure)."""
        import asyncio

        from tritonclient.utils import InferenceServerException
        try:
            result = await asyncio.wait_for(
                self.http.infer(model, inputs, request_id=request_id, **kw), self.spec.timeout_s)
            return result, None
        except asyncio.TimeoutError:
            return None, Outcome("info", {}, f"timeout after {self.spec.timeout_s}s")
        except InferenceServerException as e:
            status = str(e.status() or "")
            msg = str(e.message() or e)[:300]
            # A status is an answer. 4xx: rejected before it ran (fail). 500:
            # Triton's own error answer, the model ran and said it failed
            # (fail). 502/503/504 come from a router or proxy whose upstream
            # was lost: the request may have run (info), as for vLLM.
            # No status: the connection failed (refused = not sent).
            if status:
                code = int(status) if status.isdigit() else 0
                kind = "info" if code > 500 else "fail"
                return None, Outcome(kind, {"status": status}, f"HTTP {status}: {msg}")
            low = msg.lower()
            refused = any(w in low for w in ("refused", "cannot connect", "failed to connect"))
            return None, Outcome("fail" if refused else "info", {}, f"transport: {msg}")
        except (OSError, ValueError) as e:
            return None, Outcome("info", {}, f"transport: {type(e).__name__}: {e}")

    async def _infer(self, req: PlannedRequest, request_id: str) -> Outcome:
        import numpy as np
        import tritonclient.http.aio as httpclient

        prompt = np.frombuffer(req.prompt.encode(), dtype=np.uint8)
        inputs = [httpclient.InferInput("text_input", [len(prompt)], "UINT8"),
                  httpclient.InferInput("max_tokens", [1], "INT32"),
                  httpclient.InferInput("temperature", [1], "FP32")]
        inputs[0].set_data_from_numpy(prompt, binary_data=False)
        inputs[1].set_data_from_numpy(np.array([req.max_tokens], dtype=np.int32),
                                      binary_data=False)
        inputs[2].set_data_from_numpy(np.array([req.temperature], dtype=np.float32),
                                      binary_data=False)
        start = time.monotonic_ns()
        result, bad = await self._call(ONCE_MODEL, inputs, request_id)
        if bad is not None:
            return bad
        end = time.monotonic_ns()
        ids = [int(x) for x in result.as_numpy("token_ids").reshape(-1)]
        value = {"status": 200, "node": node_of(result), "output_tokens": len(ids),
                 "output_hash": output_hash(",".join(map(str, ids))),
                 "finish_reason": "length" if len(ids) >= req.max_tokens else "stop",
                 **_latencies(start, end, [end], len(ids))}
        return Outcome("ok", value) if ids else Outcome("fail", value, "no token in the answer")

    async def _sequence(self, step: Step, request_id: str) -> Outcome:
        import numpy as np
        import tritonclient.http.aio as httpclient

        sent = jumped(step, self.jumps.next_jump())
        inputs = [httpclient.InferInput("value", [1, 1], "INT64"),
                  httpclient.InferInput("step", [1, 1], "INT64")]
        inputs[0].set_data_from_numpy(np.array([[sent.value]], dtype=np.int64), binary_data=False)
        inputs[1].set_data_from_numpy(np.array([[sent.step]], dtype=np.int64), binary_data=False)
        start = time.monotonic_ns()
        ok = False
        try:
            result, bad = await self._call(
                self.sequence_model, inputs, request_id, sequence_id=sent.sequence_id,
                sequence_start=sent.start, sequence_end=sent.end,
                headers={SEQUENCE_HEADER: str(sent.sequence_id)})
            if bad is not None:
                return bad
            end = time.monotonic_ns()
            answer = {k: int(result.as_numpy(k).reshape(-1)[0])
                      for k in ("count", "total", "applied_step")}
            answer["node"] = node_of(result)
            ok = True
            return Outcome("ok", {"status": 200, **answer, **_latencies(start, end, [], 0)})
        finally:
            self.sequences.done(step, ok)
