"""The workload runner: sends a seeded plan (load/plan.py) through a client
(load/client.py) and records every request in the history.

The workload: seeded request plans (pure) and an async client that sends
them and records every request in the history (thin adapter).

Arrivals follow ``vllm bench serve``: open loop with gamma-distributed gaps
of mean 1/rate (shape = burstiness; 1.0 is Poisson), or closed loop with a
fixed number of concurrent clients. Each request is its own history process
(open loop) or belongs to its client (closed loop), so every process has at
most one request in flight, which is what the checkers pair on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Awaitable, Callable

from load.client import EngineClient, OpenAIClient, Outcome, plan_extras, url_endpoint
from load.plan import PlannedRequest, plan_requests
from load.spec import WorkloadSpec
from ordeal.history.writer import History, HistoryWriteError
from ordeal.networks import SESSION_NETWORKS

Progress = Callable[[str], None]


class WorkloadRunner:
    """Drives a plan against ``base_url`` and records it in ``history``.
    ``client`` makes each planned request concrete for the engine (a
    callable returning an EngineClient, called inside the event loop);
    by default the OpenAI API at ``base_url``."""

    def __init__(self, spec: WorkloadSpec, base_url: str, history: History,
                 progress: Progress | None = None, progress_every_s: float = 5.0,
                 client: Callable[[], EngineClient] | None = None,
                 share: tuple[int, int] = (0, 1)):
        """``share`` (i, n): send only the plan's requests whose seq % n
        is i (a load worker's part: load/workers.py runs the load in
        several processes)."""
        self.make_client = client or (lambda: OpenAIClient(spec, base_url))
        self.share = share
        # A load worker's (load/workers.py): may the request due at this
        # time (time.monotonic()) be sent? Waits for the parent to say.
        self.gate: Callable[[float], Awaitable[bool]] | None = None
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        # Before any request is sent (NotOurs names the address and the fix).
        SESSION_NETWORKS.require_ours(url_endpoint(self.base_url), "load")
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

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def _one(self, client: Any, process: int | str, req: PlannedRequest,
                   due: float | None = None, queued: bool = False) -> None:
        try:
            await self._one_recorded(client, process, req, due, queued)
        except HistoryWriteError as e:
            # Nothing from here on would be recorded: stop sending, and let
            # run() raise it once what is in flight has ended.
            if self.history_failure is None:
                self.history_failure = e
                if self.progress:
                    self.progress(f"load: stopping, the history cannot be written: {e}")
            self.stop()

    async def _one_recorded(self, client: Any, process: int | str,
                            req: PlannedRequest, due: float | None = None,
                            queued: bool = False) -> None:
        rid = f"{self.rid_prefix}-{req.seq}"
        prepared = client.prepare(req, rid)
        f = prepared.f
        # Open loop: how late the request is sent against the schedule (the
        # in-flight limit, or a harness too busy to send on time). The
        # checkers add it to TTFT and E2E: a user would have waited too.
        # ``queued``: it found the in-flight limit reached and waited for a slot.
        lag = {} if due is None else {"lag_ms": round(max(0.0, time.monotonic() - due) * 1e3, 1),
                                      **({"queued": True} if queued else {})}
        self.history.append("invoke", process, f, {
            "seq": req.seq, "stream": req.stream, "max_tokens": req.max_tokens,
            "prompt": req.prompt, "temperature": req.temperature, "canary": req.canary,
            "request_id": rid, **lag, **plan_extras(req), **prepared.invoke})
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

    async def report_progress(self, t0: float) -> None:
        """A progress line every ``progress_every_s`` (until cancelled)."""
        while True:
            await asyncio.sleep(self.progress_every_s)
            c = self.history.counts
            if self.progress:
                self.progress(f"load {time.monotonic() - t0:5.0f}s/{self.spec.duration_s:.0f}s: "
                              f"invoked {c['invoke']} ok {c['ok']} fail {c['fail']} "
                              f"info {c['info']} in flight {self.in_flight}")

    async def run(self, until: Callable[[], bool] | None = None,
                  max_s: float | None = None, t0: float | None = None) -> None:
        """Run for ``duration_s``, and on past it while ``until`` says False
        (e.g. a fault has not healed yet), but never past ``max_s``. The
        plan's times count from ``t0`` (time.monotonic(); default: now),
        which load workers share."""
        t0 = self.t0 = time.monotonic() if t0 is None else t0
        hard_stop = t0 + (max_s if max_s is not None else self.spec.duration_s)

        def over() -> bool:
            now = time.monotonic()
            if self._stop.is_set() or now >= hard_stop:
                return True
            return now - t0 >= self.spec.duration_s and (until is None or until())

        reporter = asyncio.create_task(self.report_progress(t0))
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

    def _mine(self, req: PlannedRequest) -> bool:
        i, n = self.share
        return n == 1 or req.seq % n == i

    async def _open(self, client: Any, t0: float, over: Callable[[], bool]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        sem = asyncio.Semaphore(self.spec.max_in_flight)

        async def bounded(req: PlannedRequest) -> None:
            queued = sem.locked()
            async with sem:
                await self._one(client, req.seq, req, due=t0 + req.at_s, queued=queued)

        try:
            for req in plan_requests(self.spec):
                if not self._mine(req):
                    continue
                # uvloop's timers run on a millisecond clock and may wake a
                # little early: sleep until the request is due by our clock,
                # so none is sent early and none due past the duration goes.
                # At most ~1 ms of extra turns per request, each a sleep.
                delay = t0 + req.at_s - time.monotonic()
                while delay > 0:
                    await asyncio.sleep(delay)
                    delay = t0 + req.at_s - time.monotonic()
                if over() or (self.gate is not None and not await self.gate(t0 + req.at_s)):
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
        plan = (req for req in plan_requests(self.spec) if self._mine(req))

        async def loop(cid: int) -> None:
            while not over():
                if self.gate is not None and not await self.gate(time.monotonic()):
                    return
                await self._one(client, f"c{cid}", next(plan))

        i, n = self.share  # a worker's streams: c{i}, c{i+n}, ...
        await asyncio.gather(*(loop(c) for c in range(i, self.spec.concurrency, n)))
