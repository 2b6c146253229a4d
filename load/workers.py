"""The load from several processes (``--load-workers N``).

One event loop drives one core at most: the bench (bench/results/) saw
Ordeal's client CPU-bound on one core long before a GPU cluster is. With
N workers, each is a process of its own running the unchanged
``WorkloadRunner`` on its share of the seeded plan: the requests whose
``seq % N`` is its index (a closed loop's streams are split the same way),
so the N shares together are exactly the one-process plan, each request
sent at its planned time from one shared start.

A worker records nothing itself. Every op it would append goes to the
parent over a pipe, and the parent appends it to the run's one history as
it arrives: one writer, one index order, the same CRC chunks and the same
lock as a one-process run, and nothing to merge afterwards. An op's
``time_ns`` is when the parent recorded it (a pipe's latency after the
worker saw it, tens of microseconds); the figures inside an op (TTFT, ITL,
E2E, the schedule lag) are the worker's own, measured where the request
ran. Each invoke says which worker sent it (``worker``). A worker encodes
its ops' values as JSON itself and sends the ops of one turn of its event
loop as one message, so the writer's core is spent on the envelope, the
CRC and the write, not on every chunk of every stream (``History.append_encoded``
writes the same bytes ``append`` would). Measured in bench/results/workers.json.

Everything between the parent and a worker goes over that one
connection, in both directions: the worker's ops up, and down the start,
how far the plan may go (``horizon``) and ``stop``. Times cross it as
seconds of the plan (from the shared start), never as a clock reading, so
a worker's clock need not be the parent's: the same worker runs on
another host behind a socket (``SocketWorkers``). A *launcher* starts the
workers: ``ProcessLauncher`` (the default) as the parent's children, or
one that places them elsewhere (clusters/ray_actors.py: Ray actors on the Ray
nodes, on ``--cluster ray``).

Processes are started with ``spawn``: the parent holds threads (the
history's sealer, the health probe) and a running event loop, which a
forked child would inherit half-copied. Workers are the parent's children,
ended by their pid only; a worker that dies leaves every request it had in
flight recorded as ``info`` with why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import secrets
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any, Callable, Protocol

from load import event_loop
from load.client import OpenAIClient, url_endpoint
from load.workload import WorkloadRunner
from ordeal.config import ConfigError
from ordeal.history.writer import HistoryWriteError
from ordeal.networks import SESSION_NETWORKS, NotOurs

#: How long a worker may take to start (import, client) before the load
#: gives up on it; spawning re-imports the harness in each.
START_TIMEOUT_S = 120.0
MAX_WORKERS = 256


def check_workers(n: int) -> int:
    """``n`` if it is a usable worker count, else a ConfigError that says so."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f"--load-workers {n!r}: give a whole number from 1 (the load in this "
                          f"process) to {MAX_WORKERS}; about one per core the load may use")
    return n


@dataclass(frozen=True)
class WorkerJob:
    """What one worker needs: all of it crosses the pipe at spawn (pickled)."""

    spec: Any  # WorkloadSpec
    base_url: str
    options: Any  # load.client.ClientOptions or None
    index: int
    count: int
    rid_prefix: str
    loop: str = "auto"  # load.event_loop: the parent's --load-loop


class PipeRecorder:
    """Stands in for the History inside a worker: each op goes to the
    parent, which alone writes the file. The ops of one turn of the event
    loop go as one message (one pickle, one write), in order: the pipe
    costs the parent a read per batch, not per op."""

    def __init__(self, conn: Connection, index: int):
        self.conn = conn
        self.index = index
        self.counts: dict[str, int] = {"invoke": 0, "ok": 0, "fail": 0, "info": 0}
        self.pending: list[tuple[Any, ...]] = []
        self.broken: HistoryWriteError | None = None

    def append(self, type: str, process: int | str, f: str,
               value: dict[str, Any] | None = None, error: str | None = None) -> None:
        if self.broken is not None:
            raise self.broken  # the runner stops sending (WorkloadRunner._one)
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        value = value or {}
        if type == "invoke":
            value = {**value, "worker": self.index}
        self.pending.append((type, process, f, _encode(value), error, value.get("seq")))
        if type in self.counts:
            self.counts[type] += 1

    def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        try:
            self.conn.send(("ops", batch))
        except (BrokenPipeError, ConnectionResetError, EOFError) as e:
            # The parent is gone: nothing more would be recorded.
            self.broken = HistoryWriteError(f"load worker: the connection to the parent closed: {e}")


def _encode(value: dict[str, Any]) -> str:
    """An op's value as ``Op.to_json`` writes it (History.append_encoded)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except TypeError:  # not plain JSON: said as text rather than lost
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def worker_main(conn: Connection, job: WorkerJob) -> None:
    """A worker: say ready, wait for the shared start, run its share, say
    done (with the error, if it ended on one)."""
    error: str | None = None
    load_cpu_s = 0.0
    recorder: PipeRecorder | None = None
    try:
        # The parent's own WorkloadRunner checked this endpoint before any
        # worker was spawned; what the session may touch is kept per
        # process, so the worker is told of that one host, nothing more.
        host = url_endpoint(job.base_url).host
        try:
            SESSION_NETWORKS.allow(host)
        except NotOurs:
            SESSION_NETWORKS.allow_host(host)
        recorder = PipeRecorder(conn, job.index)
        runner = WorkloadRunner(job.spec, job.base_url, recorder,  # type: ignore[arg-type]
                                client=lambda: OpenAIClient(job.spec, job.base_url, job.options),
                                share=(job.index, job.count))
        runner.rid_prefix = job.rid_prefix
        conn.send(("ready", job.index, os.getpid(), socket.gethostname()))
        message = conn.recv()
        if message[0] == "go":  # ("go", start in s from now, plan seconds it may send)
            cpu0 = time.process_time()  # the load's own CPU, past the start-up's imports
            t0 = time.monotonic() + message[1]
            event_loop.run(_run_share(runner, conn, _Control(t0, t0 + message[2])), job.loop)
            load_cpu_s = time.process_time() - cpu0
    except BaseException as e:  # noqa: BLE001 - said to the parent, which records it
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
    try:
        if recorder is not None:
            recorder.flush()  # what the last turn of the loop recorded
        conn.send(("done", error, load_cpu_s))
    except OSError:
        pass
    finally:
        conn.close()


@dataclass
class _Control:
    """What the parent has said, in this worker's clock."""

    t0: float  # the shared start (time.monotonic() here)
    horizon: float  # requests due before it may be sent
    stopped: bool = False


async def _run_share(runner: Any, conn: Connection, control: _Control) -> None:
    """The runner until the parent says stop: the parent alone knows the
    run's duration, its heals and its stop conditions. A request due
    before ``horizon`` (the load's duration, pushed on by the parent while
    it goes on past it) is sent; one due later waits until the parent
    either pushes the horizon past it or stops, so the workers together
    send what one process would have. A parent gone is a stop."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        control.stopped = True
        runner.stop()  # no new request; those in flight complete
        loop.remove_reader(conn.fileno())

    def readable() -> None:
        try:
            while conn.poll():
                message = conn.recv()
                if message[0] == "horizon":
                    control.horizon = max(control.horizon, control.t0 + message[1])
                elif message[0] == "stop":
                    stop()
                    return
        except (EOFError, OSError):
            stop()

    async def gate(due: float) -> bool:
        while due >= control.horizon:
            if control.stopped:
                return False
            await asyncio.sleep(0.01)
        return not control.stopped

    runner.gate = gate
    loop.add_reader(conn.fileno(), readable)
    try:
        await runner.run(until=lambda: False, max_s=float("inf"), t0=control.t0)
    finally:
        if not control.stopped:
            loop.remove_reader(conn.fileno())


# -- launchers: where the workers run ------------------------------------------

class WorkerHandle(Protocol):
    """One started worker, as the pool sees it, whatever runs it.
    ``ready``: its "ready" message when the launcher already read it (a
    socket's first message says which worker dialled); else None."""

    ready: tuple[Any, ...] | None

    def exited(self) -> str | None:
        """None while it runs; else how it ended ("exit code 1")."""
        ...

    def end(self, grace_s: float = 5.0) -> None:
        """End it now: ours only, by its own id."""
        ...


class WorkerLauncher(Protocol):
    """Starts workers and gives the pool a connection to each."""

    what: str  # for the progress line: "worker processes", "Ray actors"

    def launch(self, jobs: list[WorkerJob]) -> list[tuple[WorkerHandle, Connection]]:
        """Start one worker per job; the i-th pair is jobs[i]'s."""
        ...

    def close(self) -> None: ...


class ProcessHandle:
    """A worker that is a child process of this one (a WorkerHandle).
    ``ready``: its "ready" message when the launcher read it already."""

    def __init__(self, process: Any, ready: tuple[Any, ...] | None = None):
        self.process, self.ready = process, ready

    def exited(self) -> str | None:
        return None if self.process.is_alive() else f"exit code {self.process.exitcode}"

    def end(self, grace_s: float = 5.0) -> None:
        p = self.process
        if p.is_alive():
            p.terminate()
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join(grace_s)


class ProcessLauncher:
    """The default: each worker a child process of this one, on this host,
    over a pipe."""

    what = "worker processes"

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")

    def launch(self, jobs: list[WorkerJob]) -> list[tuple[WorkerHandle, Connection]]:
        out: list[tuple[WorkerHandle, Connection]] = []
        for job in jobs:
            parent, child = self.ctx.Pipe(duplex=True)
            proc = self.ctx.Process(target=worker_main, args=(child, job),
                                    name=f"ordeal-load-worker-{job.index}", daemon=True)
            proc.start()
            child.close()
            out.append((ProcessHandle(proc), parent))
        return out

    def close(self) -> None:
        pass


class SocketWorkers:
    """The parent's end for workers elsewhere (another process tree,
    another host): a TCP listener each worker dials with ``connect_and_run``,
    authenticated by a key made for this load (multiprocessing's HMAC
    challenge, both ways), so nothing but our workers gets a connection.
    ``host``: an address of this machine the workers can reach."""

    def __init__(self, host: str = "127.0.0.1"):
        self.key = secrets.token_bytes(32)
        self.server = socket.create_server((host, 0))
        self.address = self.server.getsockname()[:2]

    def accept(self, count: int, timeout_s: float,
               alive: Callable[[], str | None] = lambda: None
               ) -> dict[int, tuple[Connection, tuple[Any, ...]]]:
        """``count`` authenticated connections with the "ready" message
        each sent first, by the worker index it names. ``alive`` says why
        the workers cannot come any more (one of them ended), to stop
        waiting early."""
        out: dict[int, tuple[Connection, tuple[Any, ...]]] = {}
        deadline = time.monotonic() + timeout_s
        self.server.settimeout(0.5)
        while len(out) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count - len(out)} of {count} load workers did not connect "
                                   f"to {self.address[0]}:{self.address[1]} within "
                                   f"{timeout_s:.0f}s (can they reach this host?)")
            gone = alive()
            if gone:
                raise RuntimeError(f"a load worker ended before it connected: {gone}")
            try:
                sock, _ = self.server.accept()
            except socket.timeout:
                continue
            sock.setblocking(True)  # Connection reads the descriptor itself
            conn = Connection(os.dup(sock.fileno()))
            # A dialer that connects and says nothing would hold the blocking
            # reads below forever: at the deadline its socket is shut down,
            # which ends a blocked read with EOF.
            guard = threading.Timer(max(0.0, deadline - time.monotonic()), _shut_down, (sock,))
            guard.start()
            try:
                deliver_challenge(conn, self.key)
                answer_challenge(conn, self.key)
                message = conn.recv()
            except (OSError, EOFError, multiprocessing.AuthenticationError):
                conn.close()  # not one of ours, or it broke: the deadline still counts
                continue
            finally:
                guard.cancel()
                sock.close()  # conn holds its own descriptor of the connection
            if message[0] != "ready":
                conn.close()
                raise RuntimeError(f"load worker failed to start: {message[1]}")
            out[message[1]] = (conn, message)
        return out

    def close(self) -> None:
        self.server.close()


def _shut_down(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


def connect_and_run(address: tuple[str, int], key: bytes, job: WorkerJob) -> None:
    """A worker elsewhere (a Ray actor): dial the parent's ``SocketWorkers``
    and run ``job`` over that connection."""
    conn = Client(tuple(address), authkey=key)
    worker_main(conn, job)


@dataclass
class _Worker:
    index: int
    handle: WorkerHandle
    conn: Connection
    pid: int | None = None
    host: str | None = None
    done: bool = False
    error: str | None = None
    open: dict[Any, tuple[str, int | None]] = field(default_factory=dict)  # process -> (f, seq)


class WorkerPool:
    """The parent's side: N workers, their ops into ``history``."""

    def __init__(self, spec: Any, base_url: str, options: Any, count: int, rid_prefix: str,
                 history: Any, progress: Any = None, loop: str = "auto",
                 launcher: WorkerLauncher | None = None):
        self.spec, self.base_url, self.options = spec, base_url, options
        self.loop = loop
        self.count = check_workers(count)
        self.rid_prefix = rid_prefix
        self.history = history
        self.progress = progress
        self.launcher = launcher or ProcessLauncher()
        self.t0 = 0.0  # the shared start, time.monotonic() here
        self.horizon_s = float("inf")  # plan seconds the workers may send up to
        self.stopped = False
        self.workers: list[_Worker] = []
        self.in_flight = 0
        self.load_cpu_s = 0.0  # the workers' CPU seconds from the shared start to done
        self.history_failure: HistoryWriteError | None = None
        self.errors: list[str] = []

    # -- start ------------------------------------------------------------------
    async def start(self) -> float:
        """Start every worker, wait until each is ready, give them one start
        time; returns it (time.monotonic() here; each worker gets it as
        seconds from now, in its own clock)."""
        loop = asyncio.get_running_loop()
        # The in-flight limit is the run's, shared: each worker gets its part.
        share_spec = dataclasses.replace(
            self.spec, max_in_flight=max(1, -(-self.spec.max_in_flight // self.count)))
        jobs = [WorkerJob(share_spec, self.base_url, self.options, i, self.count,
                          self.rid_prefix, self.loop) for i in range(self.count)]
        started = await asyncio.to_thread(self.launcher.launch, jobs)
        self.workers = [_Worker(i, handle, conn) for i, (handle, conn) in enumerate(started)]
        deadline = time.monotonic() + START_TIMEOUT_S
        for w in self.workers:
            message = w.handle.ready
            if message is None:
                while not w.conn.poll():
                    gone = w.handle.exited()
                    if gone or time.monotonic() > deadline:
                        raise RuntimeError(f"load worker {w.index} did not start "
                                           f"({gone or 'still starting'}) within "
                                           f"{START_TIMEOUT_S:.0f}s")
                    await asyncio.sleep(0.05)
                message = w.conn.recv()
            if message[0] != "ready":  # it ended at once, with why
                raise RuntimeError(f"load worker {w.index} failed to start: {message[1]}")
            w.pid, w.host = message[2], message[3]
        self.t0 = time.monotonic() + 0.05
        self.horizon_s = self.spec.duration_s
        for w in self.workers:
            w.conn.send(("go", self.t0 - time.monotonic(), self.horizon_s))
            loop.add_reader(w.conn.fileno(), self._readable, w)
        if self.progress:
            here = socket.gethostname()
            self.progress(f"load: {self.count} {self.launcher.what} (pids "
                          + ", ".join(str(w.pid) + ("" if w.host == here else f" on {w.host}")
                                      for w in self.workers) + ")")
        return self.t0

    # -- ops --------------------------------------------------------------------
    def _readable(self, w: _Worker) -> None:
        try:
            while not w.done and w.conn.poll():
                self._handle(w, w.conn.recv())
        except (EOFError, OSError):
            self._lost(w, f"load worker {w.index} (pid {w.pid}) died "
                          f"({w.handle.exited() or 'its connection closed'})")

    def _handle(self, w: _Worker, message: tuple[Any, ...]) -> None:
        if message[0] == "done":
            w.error, self.load_cpu_s = message[1], self.load_cpu_s + message[2]
            if w.error:
                self._lost(w, f"load worker {w.index} ended on an error: {w.error}")
            else:
                self._finish(w)
            return
        for type_, process, f, value_json, error, seq in message[1]:  # ("ops", [...])
            if type_ == "invoke":
                w.open[process] = (f, seq)
                self.in_flight += 1
            elif process in w.open:
                del w.open[process]
                self.in_flight -= 1
            self._append(type_, process, f, value_json, error)

    def _append(self, type_: str, process: Any, f: str, value: dict[str, Any] | str,
                error: str | None) -> None:
        """One op into the history: a worker's value comes encoded."""
        if self.history_failure is not None:
            return
        try:
            if isinstance(value, str):
                self.history.append_encoded(type_, process, f, value, error)
            else:
                self.history.append(type_, process, f, value, error)
        except HistoryWriteError as e:
            self.history_failure = e
            if self.progress:
                self.progress(f"load: stopping, the history cannot be written: {e}")
            self.stop()

    def _lost(self, w: _Worker, why: str) -> None:
        """A worker gone before it said done cleanly: what it had in flight
        ends as info with why, never lost from the history."""
        if w.done:
            return
        self.errors.append(why.split("\n", 1)[0])
        if self.progress:
            self.progress(f"load: {why.splitlines()[0]}")
        for process, (f, seq) in list(w.open.items()):
            self._append("info", process, f, {"seq": seq},
                         f"harness error: {why.splitlines()[0]}, before an answer")
            self.in_flight -= 1
        w.open.clear()
        self._finish(w)

    def _finish(self, w: _Worker) -> None:
        w.done = True
        try:
            asyncio.get_running_loop().remove_reader(w.conn.fileno())
        except (RuntimeError, ValueError, OSError):
            pass

    # -- stop -------------------------------------------------------------------
    def _say(self, message: tuple[Any, ...]) -> None:
        for w in self.workers:
            if not w.done:
                try:
                    w.conn.send(message)
                except OSError:
                    pass  # gone: its reader sees the EOF and records why

    def stop(self) -> None:
        """No worker sends a new request; those in flight complete."""
        if not self.stopped:
            self.stopped = True
            self._say(("stop",))

    def go_on(self, until: float) -> None:
        """The load goes on past its duration (a fault has not healed):
        requests due before ``until`` (time.monotonic() here) may be sent."""
        if not self.stopped and until - self.t0 > self.horizon_s:
            self.horizon_s = until - self.t0
            self._say(("horizon", self.horizon_s))

    def all_done(self) -> bool:
        for w in self.workers:
            gone = None if w.done else w.handle.exited()
            if gone:
                self._readable(w)  # what it sent before it exited, then EOF
                if not w.done:
                    self._lost(w, f"load worker {w.index} (pid {w.pid}) exited "
                                  f"({gone}) without saying done")
        return all(w.done for w in self.workers)

    async def close(self, grace_s: float) -> None:
        """Stop, wait up to ``grace_s`` for the workers to finish what is in
        flight, then end those left (ours, each by its own id)."""
        self.stop()
        deadline = time.monotonic() + grace_s
        while not self.all_done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for w in self.workers:
            await asyncio.to_thread(w.handle.end)
            if not w.done:
                self._lost(w, f"load worker {w.index} (pid {w.pid}) ended by the harness "
                              f"after {grace_s:.0f}s")
            w.conn.close()
        self.launcher.close()


async def run_in_workers(runner: WorkloadRunner, count: int, options: Any = None,
                         until: Callable[[], bool] | None = None,
                         max_s: float | None = None, loop: str = "auto",
                         launcher: WorkerLauncher | None = None) -> None:
    """``runner.run(until, max_s)`` with the load in ``count`` processes:
    this loop records their ops into ``runner.history`` and decides when
    they stop, by the same rule (the duration, then ``until``, never past
    ``max_s``, or ``runner.stop()``). ``options``: the OpenAI client's
    (load.client.ClientOptions; an external deployment's headers, key
    variable, TLS). Sets ``runner.t0``, ``runner.worker_errors`` (a
    worker that died) and ``runner.worker_cpu_s`` (the workers' CPU from
    the shared start). ``loop``: each worker's event loop (load.event_loop).
    ``launcher``: where the workers run (default: this host's processes)."""
    spec = runner.spec
    pool = WorkerPool(spec, runner.base_url, options, count, runner.rid_prefix,
                      runner.history, runner.progress, loop, launcher)
    reporter: asyncio.Task[None] | None = None
    try:
        t0 = runner.t0 = await pool.start()
        hard_stop = t0 + (max_s if max_s is not None else spec.duration_s)
        reporter = asyncio.create_task(runner.report_progress(t0))
        while not pool.all_done():
            runner.in_flight = pool.in_flight
            now = time.monotonic()
            if (runner.stopped or now >= hard_stop
                    or (now - t0 >= spec.duration_s and (until is None or until()))):
                pool.stop()
            elif now - t0 >= spec.duration_s:
                pool.go_on(now + 0.1)  # as run() would: on while ``until`` says False
            await asyncio.sleep(0.05)
    finally:
        if reporter is not None:
            reporter.cancel()
        # In flight at a stop: the requests' own timeout, then they are ended.
        await pool.close(grace_s=spec.timeout_s + 10.0)
        runner.in_flight = 0
        runner.worker_errors = pool.errors
        runner.worker_cpu_s = pool.load_cpu_s
    if pool.history_failure is not None:
        raise pool.history_failure
