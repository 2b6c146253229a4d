"""One run, wired together: a history, a workload, faults, checkers and the
run directory. Suites use this through the ``ordeal_run`` fixture; it is the
one place that knows the order of things:

    load + nemesis  ->  history.jsonl  ->  checkers  ->  summary.json

``finish()`` always writes summary.json, also when the run broke halfway
(the error goes into the summary), so a failed run still leaves evidence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from engines.base import ClientCounts
from engines.registry import engine_for
from faults.base import Fault
from faults.factory import build_faults
from faults.ledger import Ledger
from faults.nemesis import FaultWindow, inject_then_heal, run_schedule
from faults.schedule import Step
from invariants import CheckerSettings, Result, RunContext
from invariants.base import check_all
from invariants.gpu import GpuMemoryBack, ThrottleExplained
from invariants.known import KnownFindings
from invariants.planted import PLANTED, with_planted
from invariants.requests import STEADY, WARMUP, RequestPairer, Timeline
from load import event_loop
from load.health_probe import HealthProbe
from load.monitor import Monitor
from load.router_watch import DEFAULT_GRACE_S, RouterGone, RouterWatch
from load.spec import WorkloadSpec, describe_spec, spec_to_dict
from load.workers import run_in_workers
from load.workload import WorkloadRunner
from load.workload_file import WorkloadFile
from ordeal.config import ConfigError
from ordeal.history.ops import HARNESS, MONITOR, NEMESIS, Op, utc_iso
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from reports.findings import findings_of
from reports.html import render_report
from reports.run_dir import RunDir
from reports.summary import build_summary, not_judgeable
from runs.disk_plan import SAY_FROM_BYTES, plan_disk, require_disk
from runs.floors import TrafficCount, judge_floors
from runs.live_metrics import LiveMetrics


@dataclasses.dataclass
class PlannedFault:
    fault: Fault
    after_s: float  # from the start of the load
    hold_s: float = 0.0  # how long it stays injected before the heal begins


def unavailable_data(cluster: Any) -> dict[str, str]:
    """What the cluster cannot give the checkers, and why (an external
    deployment's ``unavailable``; nothing for Ordeal's own clusters)."""
    ask = getattr(cluster, "unavailable", None)
    return dict(ask()) if callable(ask) else {}


def replica_names(cluster: Any) -> tuple[str, ...]:
    """The names of the cluster's replicas (nodes of role "replica"), for
    the checkers' RunContext: a fault on one of them is a failover window
    whatever the deployment calls it."""
    return tuple(n.name for n in getattr(cluster, "nodes", None) or ()
                 if getattr(n, "role", None) == "replica")


def provided_data(cluster: Any) -> dict[str, str]:
    """What the cluster gives the checkers its own way, and how (an
    external deployment's ``provided``; nothing for Ordeal's own)."""
    ask = getattr(cluster, "provided", None)
    return dict(ask()) if callable(ask) else {}


def checker_context(run_id: str, settings: CheckerSettings, cluster: Any) -> RunContext:
    """The checkers' RunContext for a run on ``cluster``: what it cannot
    give, what it gives its own way, and its replicas' names. One home for
    every kind of run (this one, endurance, explore)."""
    return RunContext(run_id=run_id, settings=settings, unavailable=unavailable_data(cluster),
                      replicas=replica_names(cluster), provided=provided_data(cluster))


def not_judged(invariant: dict[str, Any]) -> bool:
    """An invariant of summary.json that could not be judged on this
    cluster (``not_judgeable``: an external deployment lacks its data):
    "unknown", with the reason, neither a pass nor a failure; the summary's
    ``scope`` names it, and the verdict rests on the others."""
    return bool(not_judgeable(invariant))


def verdicts_allowed(summary: dict[str, Any]) -> tuple[str, ...]:
    """The verdicts a suite accepts: "pass" only. An invariant this cluster
    cannot judge is left out of it and named in ``scope`` (reports.summary);
    one that ``--require-judged`` names makes it "unknown"."""
    return ("pass",)


def verdict_problems(summary: dict[str, Any]) -> list[str]:
    """Why a suite must not accept this run's verdict: one line per
    invariant that is false and not a known finding (with its first
    counterexample), per invariant that is "unknown" for a reason other
    than a cluster that cannot give its data, per invariant
    ``--require-judged`` names that was not judged, and per harness error;
    empty when the verdict is one ``verdicts_allowed`` accepts. Every suite
    that runs a cluster ends with ``assert_verdict``: a suite that judges
    only its fault's effect lets a stack that answers wrong, loses or
    repeats requests pass."""
    problems = []
    scope = summary.get("scope") or {}
    required = set(scope.get("require_judged") or ())
    ran = {i.get("name") for i in summary.get("invariants", [])}
    for name in sorted(required - ran):
        problems.append(f"{name}: --require-judged names it, and no checker of this run "
                        "judges it")
    for i in summary.get("invariants", []):
        if i.get("valid") is False and not i.get("known"):
            examples = i.get("counterexamples") or []
            first = json.dumps(examples[0], default=str)[:400] if examples else "none listed"
            problems.append(f"{i.get('name')}: false (new finding); {len(examples)} "
                            f"counterexample(s), first: {first}")
        elif not_judged(i) and i.get("name") in required:
            why = "; ".join(f"{k}: {v}" for k, v in not_judgeable(i).items())[:300]
            problems.append(f"{i.get('name')}: not judged on this cluster, and "
                            f"--require-judged names it: {why}")
        elif i.get("valid") not in (True, False) and not not_judged(i):
            why = json.dumps(i.get("details") or {}, default=str)[:300]
            problems.append(f"{i.get('name')}: unknown (could not be judged): {why}")
    for error in summary.get("errors") or []:
        problems.append(f"harness error: {str(error)[:300]}")
    if not problems and summary.get("verdict") not in verdicts_allowed(summary):
        problems.append(f"verdict {summary.get('verdict')!r}")
    return problems


def assert_verdict(summary: dict[str, Any]) -> None:
    """Fail the calling test with ``verdict_problems``: which invariant and
    its counterexample, and where the run's files are."""
    problems = verdict_problems(summary)
    if problems:
        where = summary.get("run_id", "?")
        raise AssertionError(f"run {where}: verdict {summary.get('verdict')!r}, not accepted:\n  "
                             + "\n  ".join(problems)
                             + f"\n(see reports/runs/{where}/summary.json and report.html)")


def count_traffic(count: TrafficCount, pairer: RequestPairer, op: Op) -> None:
    """One op into the run's traffic count (``runs.floors``): invokes in
    all and per fault window while the fault is in place (its inject ended,
    its heal not begun), completed requests by whether a fault could have
    touched them."""
    timeline = pairer.timeline
    if op.process in HARNESS:
        before = {w.label: w for w in timeline.faults.open.values()}
        pairer.feed(op)
        for w in before.values():  # a window whose fault left its place now
            if w.injected_ns is not None and (w.heal_begin_ns is not None or w.end_ns is not None):
                until = w.heal_begin_ns if w.heal_begin_ns is not None else w.end_ns
                entry = count.windows.setdefault(w.label, [0, 0.0])
                entry[1] = max(0.0, (until - w.injected_ns) / 1e9)
        return
    if op.type == "invoke":
        count.invoked += 1
        for w in timeline.faults.open.values():
            if w.injected_ns is not None and w.heal_begin_ns is None:
                count.windows.setdefault(w.label, [0, 0.0])[0] += 1
    req = pairer.feed(op)
    if req is None:
        return
    if req.done.type == "ok":
        count.ok += 1
    if req.phase in (STEADY, WARMUP):  # after a heal is recovery's to judge
        count.untouched += 1
        count.untouched_ok += req.done.type == "ok"


#: What the engine's own consistency check needs of a cluster: which
#: replica answered (the client's count per node) and whether it restarted
#: (its counters began again). An external deployment gives neither.
ENGINE_CONSISTENCY_NEEDS = ("node_attribution", "process_tree")


class OrdealRun:
    def __init__(self, run_dir: RunDir, suite: str, cluster: Any,
                 progress: Callable[[str], None] = print, history: History | None = None):
        """``history``: an already open history (a resumed run's, see
        ``History.resume``); by default a new one in the run directory."""
        self.run_dir = run_dir
        self.suite = suite
        self.cluster = cluster
        self.progress = progress
        self.history = history if history is not None else History(run_dir.history_path)
        self.started = utc_iso()
        self.windows: list[FaultWindow] = []
        self.results: list[Result] = []
        self.workload: WorkloadSpec | None = None
        # --workload FILE.toml, applied to every load of this run (None: the
        # suite's own spec as it is).
        self.workload_file: WorkloadFile | None = None
        self.errors: list[str] = []
        self.summary: dict[str, Any] | None = None
        self.checker_settings = CheckerSettings()  # set by the plugin: SLO targets etc.
        # {kind: why} of the fault kinds this harness cannot inject (not
        # root, a missing capability or program): set by the plugin.
        self.unrunnable_kinds: dict[str, str] = {}
        # Failures already known of this stack (--known-findings, or the file
        # shipped for the embedded stack): reported, out of the verdict.
        self.known_findings: KnownFindings | None = None
        # --require-judged: invariants that must be judged for a pass
        # (reports.summary.scope_of).
        self.require_judged: tuple[str, ...] = ()
        # The settings check() was given instead, if any: summary.json
        # "settings" says what the run was judged with.
        self.judged_settings: CheckerSettings | None = None
        self.drain_s = 3.0  # most wait after the load for idle engines, then the drained sample
        # --load-workers: the load in this many processes (load/workers.py).
        self.load_workers = 1
        self.load_launcher: Any = None  # load.workers.WorkerLauncher; None: this host
        # --load-loop: the load's event loop (load/event_loop.py).
        self.load_loop = "auto"
        # --metrics-port/--metrics-host: OpenMetrics of the run while it goes
        # (runs/live_metrics.py), from the load's start to finish().
        self.metrics_port: int | None = None
        self.metrics_host = "127.0.0.1"
        self.live_metrics: LiveMetrics | None = None
        self.schedule: list[dict[str, Any]] = []
        self.summary_extra: dict[str, Any] = {}  # keys a suite adds to summary.json
        # The traffic floors of the last check (runs/floors.py), in summary.json.
        self.floors: dict[str, Any] = {}
        # Why the run stopped before its end (the router died for good), or
        # None; summary.json's "stopped", and one of its errors.
        self.stop_reason: str | None = None
        self._t0 = time.monotonic()  # durations come from the monotonic clock only
        # The engine's adapter (engines/base.py): its client, its checkers,
        # its own consistency check. A cluster names its engine.
        self.engine = (getattr(cluster, "engine_adapter", None)
                       or engine_for(getattr(cluster, "engine", None) or "vllm",
                                     getattr(cluster, "spec", None)))

    def expected_requests(self, share: float = 1.0) -> float:
        """``share`` of the requests the last load's workload plans over its
        duration: rate x duration in the open loop, one per user closed."""
        spec = self.workload
        if spec is None:
            return 0.0
        if spec.mode == "closed":
            return float(spec.concurrency)
        return share * spec.rate * spec.duration_s

    @property
    def run_id(self) -> str:
        return self.run_dir.run_id

    def load(self, spec: WorkloadSpec, faults: Sequence[PlannedFault] = (),
             after_heal_s: float = 15.0, max_s: float = 900.0,
             schedule: Sequence[Step] = (), schedule_seed: int = 0,
             monitor_interval_s: float = 2.0, stop: Callable[[], bool] | None = None,
             load_progress_every_s: float = 5.0,
             router_grace_s: float | None = DEFAULT_GRACE_S) -> None:
        """Drive ``spec`` against the cluster's entrypoint while ``faults``
        (each at its time) and ``schedule`` (a faults.schedule plan, targets
        chosen with ``schedule_seed``) run. The load goes on for at least
        ``spec.duration_s`` and until ``after_heal_s`` after the last heal,
        so the recovery is in the history; never past ``max_s``. When
        ``stop()`` says True (a stop condition), the load ends and the
        nemesis is cancelled, which heals whatever is injected.

        If the cluster's router is down (process exited or port refusing)
        for ``router_grace_s`` in a row outside a fault of this run that
        targets it, the load stops the same way, the stop is recorded (a
        ``monitor``/``router_gone`` op, ``stop_reason``) and ``RouterGone``
        is raised once everything is healed. ``None`` turns the watch off."""
        if spec.model == WorkloadSpec.model:  # the default: ask for what the engine serves
            spec = dataclasses.replace(spec, model=self.engine.served_model_name)
        if self.workload_file is not None:
            # The user's traffic (--workload) on the suite's duration and seed.
            spec = self.workload_file.spec(**{f.name: getattr(spec, f.name)
                                              for f in dataclasses.fields(spec)})
        self.workload = spec
        # What the load will write, before it starts: refused with what to
        # change when the disk cannot hold it twice (runs/disk_plan.py).
        disk = plan_disk(spec, len(getattr(self.cluster, "nodes", ())), self.run_dir.path)
        self.summary_extra["disk_plan"] = disk.to_dict()
        if disk.need_bytes >= SAY_FROM_BYTES or not disk.enough:
            self.progress(disk.line())
        require_disk(disk)
        if self.metrics_port is not None and self.live_metrics is None:
            self.live_metrics = LiveMetrics(self.run_dir.history_path, self.run_id, self.suite)
            host, port = self.live_metrics.start(self.metrics_port, self.metrics_host)
            self.summary_extra["metrics_endpoint"] = f"http://{host}:{port}/metrics"
            self.progress(f"metrics: http://{host}:{port}/metrics (OpenMetrics of this run, "
                          "until it ends)")
        self.router_grace_s = router_grace_s
        if not self.schedule:  # a resumed run keeps the whole run's schedule
            self.schedule = [s.to_dict() for s in schedule]
        self.monitor_interval_s = monitor_interval_s
        self.load_progress_every_s = load_progress_every_s
        event_loop.run(self._load(spec, faults, after_heal_s, max_s, schedule, schedule_seed,
                                  stop), getattr(self, "load_loop", "auto"))

    async def _load(self, spec: WorkloadSpec, faults: Sequence[PlannedFault],
                    after_heal_s: float, max_s: float, schedule: Sequence[Step] = (),
                    schedule_seed: int = 0, stop: Callable[[], bool] | None = None) -> None:
        entry = self.cluster.entrypoint.url
        try:  # the engine's counters now, for engine_consistency after the load
            self.engine_mark = self.engine.mark(self.cluster)
        except Exception as e:  # noqa: BLE001 - reported by the check, never fatal
            self.engine_mark = {"error": f"{type(e).__name__}: {e}"}
        workers = getattr(self, "load_workers", 1)
        if workers > 1 and self.engine.name != "vllm":
            raise ConfigError(f"--load-workers {workers}: the load workers speak the OpenAI "
                              f"API only; --engine {self.engine.name} runs its load in one "
                              "process (give --load-workers 1)")
        # Where the workers run: a backend that has nodes of its own for them
        # says so (--cluster ray: actors on the Ray nodes); else this host.
        placer = getattr(self.cluster, "load_worker_launcher", None)
        self.load_launcher = placer() if workers > 1 and placer else None
        runner = WorkloadRunner(spec, entry, self.history, progress=self.progress,
                                progress_every_s=getattr(self, "load_progress_every_s", 5.0),
                                client=lambda: self.engine.client(spec, entry, self.cluster))
        made: list[Fault] = [p.fault for p in faults]  # every fault of this load
        nemesis = [asyncio.create_task(inject_then_heal(p.fault, self.history, p.after_s,
                                                        p.hold_s, self.progress))
                   for p in faults]
        if schedule:
            rng = random.Random(schedule_seed)
            ledger = Ledger()

            def make(step: Step) -> list[Fault]:
                built = build_faults(step.kind, step.target, self.cluster, self.run_id, ledger,
                                     rng, step.params)
                made.extend(built)
                return built

            nemesis.append(asyncio.create_task(
                run_schedule(schedule, make, self.history, self.progress)))

        healed_at: list[float] = []
        router = getattr(self.cluster, "router", None)
        monitor = Monitor(self.cluster.replicas(), self.history,
                          interval_s=getattr(self, "monitor_interval_s", 2.0),
                          common_metrics=self.engine.collect_metrics,
                          processes=[router] if router is not None else [])
        sampling = asyncio.create_task(monitor.run())
        # Router, every replica, the model, the GPU: once a second, on a
        # thread of its own, into health.jsonl (see load/health_probe.py).
        probe = HealthProbe(self.cluster, self.run_dir.path / "health.jsonl",
                            model=self.engine.served_model_name, gpu=monitor.gpu).start()

        async def watch_stop() -> None:
            while not stop():
                await asyncio.sleep(0.5)
            runner.stop()  # no new request; those in flight complete
            for t in nemesis:
                t.cancel()  # run_schedule and inject_then_heal heal in their finally

        watcher = asyncio.create_task(watch_stop()) if stop is not None else None
        gone: list[str] = []
        router = getattr(self.cluster, "router", None)
        grace = getattr(self, "router_grace_s", DEFAULT_GRACE_S)

        async def watch_router() -> None:
            watch = RouterWatch(router, grace_s=grace, say=self.progress,
                                expected_down=lambda: any(  # a fault of ours on it
                                    f.active and router.name in f.target.split(",")
                                    for f in made))
            message = await watch.wait_gone()
            gone.append(message)
            self.stop_reason = message
            self.progress(f"run: stopping: {message}")
            try:
                self.history.append("info", MONITOR, "router_gone", {
                    "node": router.name, "url": router.endpoint.url, "pid": watch.pid,
                    "exit_code": watch.exit_code, "grace_s": grace, "seen": watch.last_seen,
                    "log_tail": router.log_tail(12)}, message.split("\n", 1)[0])
            except OSError:
                pass  # a full disk is its own stop (HistoryWriteError), raised by the load
            runner.stop()  # no new request; those in flight complete (or fail fast)
            for t in nemesis:
                t.cancel()  # run_schedule and inject_then_heal heal in their finally

        router_watch = (asyncio.create_task(watch_router())
                        if router is not None and grace else None)

        # When each nemesis task ended (its last heal): the after-heal time
        # counts from there. The runner asks ``settled`` only once the
        # load's duration has passed, so the time of that first question
        # would add the rest of the duration to every after-heal window.
        for t in nemesis:
            t.add_done_callback(lambda _t: healed_at.append(time.monotonic()))

        def settled() -> bool:
            if len(healed_at) < len(nemesis):  # a task not done (or its callback not yet run)
                return False
            return not nemesis or time.monotonic() - max(healed_at) >= after_heal_s

        try:
            try:
                if workers > 1:  # the same load from several processes
                    await run_in_workers(runner, workers,
                                         getattr(self.cluster, "client_options", None),
                                         loop=getattr(self, "load_loop", "auto"),
                                         until=settled, max_s=max(max_s, spec.duration_s),
                                         launcher=self.load_launcher)
                else:
                    await runner.run(until=settled, max_s=max(max_s, spec.duration_s))
            except BaseException:
                for t in nemesis:
                    t.cancel()  # the load is over: heal now (they heal in their finally)
                raise
            finally:  # a load worker that died (its requests are info ops with why)
                self.errors.extend(getattr(runner, "worker_errors", []))
            if gone or (watcher is not None and watcher.done()):
                pass  # stopped on purpose; the nemesis was cancelled and heals
            elif not all(t.done() for t in nemesis):
                self.errors.append(f"load stopped at its {max_s:.0f}s cap before every fault "
                                   "had healed; the heal is not covered by traffic")
        finally:
            for outcome in await asyncio.gather(*nemesis, return_exceptions=True):
                got = outcome if isinstance(outcome, list) else [outcome]
                for window in got:
                    if isinstance(window, FaultWindow):
                        self.windows.append(window)
                        if window.error:
                            self.errors.append(f"{window.kind} on {window.target}: "
                                               f"{window.error}")
                    elif isinstance(window, asyncio.CancelledError):
                        self.errors.append("nemesis cancelled by a stop condition"
                                           f"{' (the router is gone)' if gone else ''}; "
                                           "what it had injected was healed")
                    else:
                        self.errors.append(f"nemesis task failed: {window!r}")
            sampling.cancel()
            probe.stop()
            self.summary_extra["health_probe"] = probe.summary()
            others = [t for t in (watcher, router_watch) if t is not None]
            for t in others:
                t.cancel()
            await asyncio.gather(sampling, *others, return_exceptions=True)
            # The drained state: what the leak checker compares to baseline,
            # once the engines say they are idle (at most drain_s).
            if runner.history_failure is None:
                waited = await monitor.wait_quiet(self.drain_s)
                self.summary_extra["drain"] = {"waited_s": round(waited, 2),
                                               "max_s": self.drain_s}
                await monitor.sample_all("drain")
        if gone:
            raise RouterGone(gone[0])

    def check(self, checkers: Sequence[Any] | None = None,
              settings: CheckerSettings | None = None) -> list[Result]:
        """Run checkers over history.jsonl as written: each one streams the
        file, so memory stays flat however long the run was. ``settings``
        (default: the run's ``checker_settings``) go to the checkers' RunContext."""
        self.history.flush()
        if settings is not None:
            self.judged_settings = settings
        ctx = checker_context(self.run_id,
                              self.checker_settings if settings is None else settings,
                              self.cluster)
        chosen = checkers if checkers is not None else self.engine.checkers()
        if checkers is None and getattr(getattr(self.cluster, "vllm_build", None), "gpu", False):
            # Replicas on GPUs (engines/vllm/gpus.py): the monitor's NVML
            # readings are judged as in the GPU scenario (invariants/gpu.py).
            chosen = [*chosen, GpuMemoryBack(), ThrottleExplained()]
        if (checkers is None and self.engine.name == "vllm"
                and any(w.kind in PLANTED for w in self.windows)):
            # A fault that corrupts answers on purpose (lsn_jump's SSE variant,
            # vLLM's) is judged as detection, the rest of the history as usual
            # (invariants/planted.py). Triton's lsn_jump corrupts no answer: it
            # jumps a sequence, which sequence_consistent judges as detected.
            chosen = with_planted(chosen)
        damaged: list[str] = []
        counts = ClientCounts()

        traffic = TrafficCount()
        pairer = RequestPairer(Timeline(ctx.settings.slo.after_heal_s, ctx.settings.warmup_s))

        def counted(ops: Iterable[Op]) -> Iterator[Op]:
            for op in ops:  # the client's side, for the engine's own check below
                if op.type in ("ok", "fail", "info") and op.process not in (NEMESIS, MONITOR):
                    counts.add(op, op.f)
                count_traffic(traffic, pairer, op)
                yield op

        ops = read_history(self.run_dir.history_path, on_error=damaged.append)
        self.results = check_all(chosen, counted(ops), ctx)  # one pass for every checker
        self.errors.extend(damaged)
        if checkers is None and self.cluster is not None and hasattr(self.cluster, "replicas"):
            # An invariant like the others: when it cannot be judged here
            # (every replica restarted, statistics unreadable) it is
            # "unknown" with why, in the verdict; only a cluster that cannot
            # give its data (not_judgeable) puts it in the scope instead.
            judged = self._engine_consistency(counts)
            missing = {k: why for k, why in ctx.unavailable.items()
                       if k in ENGINE_CONSISTENCY_NEEDS}
            if judged.valid == "unknown" and missing:  # a cluster that cannot give the data
                judged.details["not_judgeable"] = missing
            self.results.append(judged)
            floor, self.floors = judge_floors(self.workload, traffic,
                                              ctx.settings.slo.max_error_rate)
            self.results.append(floor)
        if self.live_metrics is not None:
            self.live_metrics.read_new()
            self.live_metrics.set_invariants(self.results)
        return self.results

    def _engine_consistency(self, counts: ClientCounts) -> Result:
        """The engine's own records against the client's (its statistics or
        counters, read now from the live nodes); never raises."""
        mark = getattr(self, "engine_mark", None)
        if mark is None or "error" in mark:
            return Result("engine_consistency", "unknown", {
                "why": (mark or {}).get("error", "no load was run, nothing to compare")})
        try:
            return self.engine.validate_consistency(self.cluster, counts, mark)
        except Exception as e:  # noqa: BLE001 - a broken check is "unknown", not a crash
            return Result("engine_consistency", "unknown",
                          {"error": f"{type(e).__name__}: {e}"})

    def finish(self, error: str | None = None) -> dict[str, Any]:
        """Write summary.json. Safe to call again (the fixture calls it after
        the suite did): a later call only adds ``error`` and rewrites."""
        first = self.summary is None
        if self.stop_reason and self.stop_reason not in self.errors:
            self.errors.append(self.stop_reason)
        if error:
            self.errors.append(error)
        if self.live_metrics is not None:
            self.live_metrics.close()
        self.history.close()
        invariants = [r.to_dict() for r in self.results]
        faults = [w.to_dict() for w in self.windows]
        if self.known_findings is not None:
            self.summary_extra["known_findings"] = self.known_findings.apply(invariants, faults)
        ended, duration_s = utc_iso(), time.monotonic() - self._t0  # this harness's segment
        self.summary = build_summary(
            run_id=self.run_id, suite=self.suite, started=self.started, ended=ended,
            cluster=self.cluster.describe() if self.cluster else {},
            counts=self.history.counts, nemesis_counts=self.history.nemesis_counts,
            faults=faults, invariants=invariants,
            workload=spec_to_dict(self.workload) if self.workload else {},
            errors=self.errors, schedule=self.schedule, duration_s=duration_s,
            segments=self.history.segments(self.started, ended, duration_s),
            require_judged=self.require_judged)
        self.summary["stopped"] = self.stop_reason
        self.summary["load_workers"] = getattr(self, "load_workers", 1)
        launcher = getattr(self, "load_launcher", None)
        if launcher is not None:  # not this host's processes: where they ran
            self.summary["load_workers_on"] = {"what": launcher.what,
                                               "nodes": getattr(launcher, "placed", [])}
        self.summary["load_loop"] = event_loop.describe(getattr(self, "load_loop", "auto"))
        if self.workload is not None:
            self.summary["workload_effective"] = describe_spec(self.workload)
        if self.workload_file is not None:
            self.summary["workload_file"] = {
                "file": self.workload_file.path, "sha256": self.workload_file.sha256,
                "description": self.workload_file.description,
                "set_by_file": sorted(self.workload_file.overrides)}
        self.summary["settings"] = dataclasses.asdict(self.judged_settings
                                                      or self.checker_settings)
        self.summary["floors"] = self.floors
        self.summary.update(self.summary_extra)
        self.summary["findings"] = findings_of(self.summary)
        self.run_dir.write_summary(self.summary)
        render_report(self.run_dir.path)  # never raises: damage is noted in the page
        if first or error:
            self.progress(f"run {self.run_id}: verdict {self.summary['verdict']}, "
                          f"ops {self.summary['ops']}; see {self.run_dir.path}")
        return self.summary
