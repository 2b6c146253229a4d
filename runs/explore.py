"""The machinery of schedule exploration (suites/test_explore.py) and replay.

Exploration runs one Hypothesis example at a time against the live session
cluster: an ``ExampleHarness`` keeps a steady closed-loop load and the
monitor going in a background event loop, lets the state machine inject and
heal faults, send bursts and wait, records every fault action as a
``faults.schedule.Step`` (seconds since the load started), judges the history
so far with the consistency checkers, and on ``close`` heals everything and
restarts only the nodes a fault left broken, so the next example starts on a
clean cluster within seconds.

A failing example is saved as a schedule file (``save_schedule``): the steps,
the workload and the checker settings it ran with, and the invariants it
broke. ``replay`` runs such a file again through ``OrdealRun.load(schedule=)``
under the same workload, which is what makes a shrunk failure a reproducer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.registry import engine_for
from engines.vllm.nodes import SERVED_MODEL_NAME
from faults.base import Fault
from faults.factory import build_faults
from faults.heal_all import heal_entry
from faults.ledger import Ledger
from faults.schedule import Step, StepsError, need_field, steps_from_json
from invariants import (
    CheckerSettings,
    HealthTruthful,
    NoSilentLoss,
    Result,
    StreamWellFormed,
    UsageMatchesTokens,
)
from invariants.base import check_all
from load.monitor import Monitor
from load.plan import PlannedRequest
from load.spec import WorkloadSpec
from load.workload import WorkloadRunner
from ordeal.config import ConfigError
from ordeal.history.ops import NEMESIS
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from runs.run import checker_context

FORMAT_VERSION = 1
#: Consistency checkers judged after every step (issue 12: at least these).
CHECKERS = (HealthTruthful, NoSilentLoss, StreamWellFormed, UsageMatchesTokens)
#: Examples are short, so a stall of 4 s (not the default 10 s) already counts
#: as a lie: a replica of the tiny model that makes progress moves its token
#: counter every ~0.05 s here, and a hung or cut one does not answer /health.
EXPLORE_SETTINGS = CheckerSettings(health_stall_s=4.0)
#: The steady load of every example and of a replay: four clients in a
#: closed loop with long generations keep each of two replicas generating
#: all the time. That matters because vLLM's running/waiting gauges are
#: published by the engine itself: a paused engine's gauges freeze at their
#: last value. With short requests (16-48 tokens) they froze at 0 in 2 of 3
#: pauses (4 requests queued, invisible) and health_truthful saw no lie;
#: with 128-256 tokens a request is always mid-generation at the pause.
EXPLORE_WORKLOAD: dict[str, Any] = {"mode": "closed", "concurrency": 4, "duration_s": 3600.0,
                                    "max_tokens": [128, 256], "timeout_s": 10.0, "seed": 0}
WARMUP_S = 2.0  # load runs this long before the first step (also in a replay)
MONITOR_S = 1.0  # sampling interval of /health and /metrics, exploring and replaying

Say = Callable[[str], None]


class ScheduleFileError(ConfigError):
    """A schedule file that cannot be replayed; the message names the file,
    the field and what it should be."""


# ------------------------------------------------------------ schedule files

@dataclass
class SavedSchedule:
    steps: list[Step]
    seed: int = 0  # schedule_seed for OrdealRun.load (targets are names: unused)
    workload: dict[str, Any] = field(default_factory=lambda: dict(EXPLORE_WORKLOAD))
    checker_settings: CheckerSettings = EXPLORE_SETTINGS
    broke: list[str] = field(default_factory=list)  # invariants it made false
    program: list[dict[str, Any]] = field(default_factory=list)  # the rules, for people
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": "ordeal-schedule", "version": FORMAT_VERSION, "note": self.note,
                "broke": self.broke, "seed": self.seed, "workload": self.workload,
                "checker_extra": self.checker_settings.overrides(), "program": self.program,
                "steps": [s.to_dict() for s in self.steps]}


def save_schedule(path: Path, saved: SavedSchedule) -> Path:
    """Write atomically (temp file then rename): a crash never leaves half a
    reproducer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(saved.to_dict(), indent=2) + "\n")
    tmp.replace(path)
    return path


def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    try:
        return need_field(doc, key, kind, where)
    except StepsError as e:
        raise ScheduleFileError(str(e)) from None


def load_schedule(path: Path) -> SavedSchedule:
    """Read and check a schedule file; every problem raises
    ScheduleFileError naming the file and the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ScheduleFileError(f"{path}: cannot read the schedule file ({e})") from None
    except ValueError as e:
        raise ScheduleFileError(f"{path}: not JSON ({e}); a schedule file is what "
                                "suites/test_explore.py writes") from None
    if not isinstance(doc, dict) or doc.get("format") != "ordeal-schedule":
        raise ScheduleFileError(f"{path}: not an Ordeal schedule (expected an object with "
                                "\"format\": \"ordeal-schedule\")")
    if doc.get("version") != FORMAT_VERSION:
        raise ScheduleFileError(f"{path}: version {doc.get('version')!r}; this Ordeal reads "
                                f"version {FORMAT_VERSION}")
    try:
        steps = steps_from_json(_need(doc, "steps", list, str(path)), f"{path}: ")
    except StepsError as e:
        raise ScheduleFileError(str(e)) from None
    open_keys: dict[int, float] = {}
    for i, step in enumerate(steps):
        if step.action == "inject":
            open_keys[step.key] = step.at_s
        elif open_keys.pop(step.key, None) is None:
            raise ScheduleFileError(f"{path}: steps[{i}]: heal of key {step.key} without an "
                                    "earlier inject")
    if open_keys:
        raise ScheduleFileError(f"{path}: inject(s) of key(s) {sorted(open_keys)} never healed; "
                                "a schedule must end healed")
    workload = _need(doc, "workload", dict, str(path))
    try:
        workload_spec(workload)
    except (TypeError, ConfigError) as e:
        raise ScheduleFileError(f"{path}: field 'workload' is not a WorkloadSpec: {e}") from None
    try:
        settings = CheckerSettings.from_overrides(_need(doc, "checker_extra", dict, str(path)),
                                                  f"{path}: field 'checker_extra'")
    except ConfigError as e:
        raise ScheduleFileError(str(e)) from None
    return SavedSchedule(steps, _need(doc, "seed", int, str(path)), workload, settings,
                         list(_need(doc, "broke", list, str(path))),
                         list(doc.get("program", [])), str(doc.get("note", "")))


def workload_spec(d: dict[str, Any], duration_s: float | None = None) -> WorkloadSpec:
    """A WorkloadSpec from a schedule file's plain dict (JSON has no tuples)."""
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    if duration_s is not None:
        kw["duration_s"] = duration_s
    return WorkloadSpec(**kw)


def replay(run: Any, saved: SavedSchedule, after_heal_s: float = 5.0) -> list[Result]:
    """Run ``saved`` again on ``run`` (an OrdealRun): the same steps at the
    same times under the same workload and seed, judged by the same checkers
    with the same settings. The load starts with the schedule, and the steps
    were saved relative to the start of the load, so the warm-up is kept."""
    last = max((s.at_s for s in saved.steps), default=0.0)
    spec = workload_spec(saved.workload, duration_s=last + 1.0)
    # Sample as often as the exploration did: a shrunk schedule sits at the
    # edge of failing, and at 2 s a replay saw the frozen counter for only 2
    # of the 4 s stall bound in 1 of 3 tries.
    run.load(spec, schedule=saved.steps, schedule_seed=saved.seed, after_heal_s=after_heal_s,
             max_s=last + after_heal_s + 60.0, monitor_interval_s=MONITOR_S)
    return run.check(checkers=[c() for c in CHECKERS], settings=saved.checker_settings)


def broken(results: Sequence[Result]) -> list[str]:
    return sorted(r.name for r in results if r.valid is False)


def crashed(results: Sequence[Result]) -> list[str]:
    """Checkers that could not judge because they crashed (``check_all``
    turns a crash into "unknown" with the error): a harness failure, never
    counted as a pass."""
    return sorted(f"{r.name}: {r.details.get('error')}" for r in results
                  if r.valid not in (True, False) and (r.details or {}).get("error"))


# ---------------------------------------------------------- one example

class TaggedRunner(WorkloadRunner):
    """A WorkloadRunner whose client process names carry a tag: two bursts
    (each numbering its requests from 0) then never share a process, which
    the no_silent_loss pairing relies on."""

    def __init__(self, tag: str, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.tag = tag

    async def _one(self, session: Any, process: int | str, req: PlannedRequest) -> None:
        await super()._one(session, f"{self.tag}-{process}", req)


class ExampleHarness:
    """One Hypothesis example's world: load, monitor, faults and their
    schedule. ``close`` always heals and drains, and is safe to call twice."""

    def __init__(self, cluster: Any, run_id: str, history_path: Path, say: Say,
                 ledger: Ledger | None = None):
        self.cluster = cluster
        self.run_id = run_id
        self.say = say
        self.ledger = ledger or Ledger()
        self.history = History(history_path)
        self.history_path = Path(history_path)
        self.steps: list[Step] = []
        self.program: list[dict[str, Any]] = []
        self.active: dict[int, tuple[Step, list[Fault]]] = {}
        self.due: dict[int, float] = {}  # key -> monotonic time its hold ends
        self.errors: list[str] = []
        self.next_key = 0
        self.bursts = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="explore-loop",
                                       daemon=True)
        self.futures: list[Any] = []
        self.runners: list[WorkloadRunner] = []
        self.t0 = 0.0
        self.closed = False

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        self.thread.start()
        spec = workload_spec({**EXPLORE_WORKLOAD, "model": served_name(self.cluster)})
        self._run_load(WorkloadRunner(spec, self.cluster.entrypoint.url, self.history))
        monitor = Monitor(self.cluster.replicas(), self.history, interval_s=MONITOR_S,
                          common_metrics=engine_for("vllm").collect_metrics)
        self.monitor = asyncio.run_coroutine_threadsafe(monitor.run(), self.loop)
        self.t0 = time.monotonic()
        time.sleep(WARMUP_S)

    def _run_load(self, runner: WorkloadRunner) -> None:
        self.runners.append(runner)
        self.futures.append(asyncio.run_coroutine_threadsafe(runner.run(), self.loop))

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    # -- the rules' actions ---------------------------------------------------
    def inject(self, kind: str, target: str, params: dict[str, Any], hold_s: float) -> None:
        """Inject now; the fault stays at least ``hold_s`` (a heal before
        that waits for it), as a nemesis holds each fault for a drawn time.
        Without a hold, most faults drawn at the end of a program would be
        healed at once by the teardown and never seen by the checkers."""
        step = Step(self.now(), "inject", kind, target, self.next_key, dict(params))
        self.next_key += 1
        self.due[step.key] = time.monotonic() + hold_s
        self.program.append({"at_s": step.at_s, "rule": "inject", "kind": kind,
                             "target": target, "params": params, "hold_s": hold_s})
        # Targets are names, so the rng picks nothing; seeded all the same.
        faults = build_faults(kind, target, self.cluster, self.run_id, self.ledger,
                              random.Random(0), params)
        self.steps.append(step)
        done: list[Fault] = []
        try:
            for fault in faults:
                self._record("inject", fault, fault.inject)
                done.append(fault)
        finally:
            self.active[step.key] = (step, done)
        self.say(f"explore {step.at_s:6.1f}s: inject {kind} on {target} {params or ''}")

    def heal(self, key: int) -> None:
        time.sleep(max(0.0, self.due.pop(key, 0.0) - time.monotonic()))
        step, faults = self.active.pop(key)
        heal = Step(self.now(), "heal", step.kind, step.target, key, dict(step.params))
        self.steps.append(heal)
        self.program.append({"at_s": heal.at_s, "rule": "heal", "kind": step.kind,
                             "target": step.target})
        for fault in reversed(faults):
            try:
                self._record("heal", fault, fault.heal)
            except Exception as e:  # noqa: BLE001 - keep healing the rest; reported
                self.errors.append(f"heal {fault.kind} on {fault.target}: {e}")
        self.say(f"explore {heal.at_s:6.1f}s: heal {step.kind} on {step.target}")

    def burst(self, n: int) -> None:
        """``n`` extra requests within about a second, beside the steady load."""
        self.bursts += 1
        self.program.append({"at_s": self.now(), "rule": "burst", "n": n})
        spec = workload_spec({**EXPLORE_WORKLOAD, "model": served_name(self.cluster),
                              "mode": "open", "rate": float(n),
                              "seed": self.bursts}, duration_s=1.0)
        self._run_load(TaggedRunner(f"b{self.bursts}", spec, self.cluster.entrypoint.url,
                                    self.history))

    def wait(self, seconds: float) -> None:
        self.program.append({"at_s": self.now(), "rule": "wait", "s": seconds})
        time.sleep(seconds)

    def _record(self, f: str, fault: Fault, action: Callable[[], dict[str, Any]]) -> None:
        """The nemesis convention (faults.nemesis): a begin and an end op,
        so checkers see the fault's window."""
        self.history.append("info", NEMESIS, f, {"kind": fault.kind, "target": fault.target,
                                                 "phase": "begin"})
        try:
            result = action()
        except Exception as e:
            self.history.append("info", NEMESIS, f, {"kind": fault.kind, "target": fault.target,
                                                     "phase": "end"}, f"{type(e).__name__}: {e}")
            raise
        self.history.append("info", NEMESIS, f, {**result, "phase": "end"})

    # -- judging --------------------------------------------------------------
    def check(self, final: bool = False) -> list[Result]:
        """The checkers over the history so far. Before the drain, requests
        still in flight are not lost: no_silent_loss then counts only a
        broken pairing (a completion without invoke, an invoke over an open one)."""
        self.history.flush()
        damaged: list[str] = []
        results = check_all([c() for c in CHECKERS],
                            read_history(self.history_path, on_error=damaged.append),
                            checker_context(self.run_id, EXPLORE_SETTINGS, self.cluster))
        if not final:
            for i, r in enumerate(results):
                if r.name == "no_silent_loss" and r.valid is False:
                    c = r.details
                    if not (c.get("completion_without_invoke") or c.get("invoke_while_open")):
                        results[i] = Result(r.name, True, r.details)
        return results

    def schedule(self) -> list[Step]:
        return sorted(self.steps, key=lambda s: (s.at_s, s.action != "heal"))

    # -- the end of an example --------------------------------------------------
    def close(self, drain_s: float = 15.0) -> list[Result]:
        """Heal what is still injected (each, then the ledger entries of this
        run), stop the load and let what is in flight end, and judge the
        whole history once more. Returns that final judgement."""
        if self.closed:
            return []
        self.closed = True
        try:
            for key in sorted(self.active, key=lambda k: self.due.get(k, 0.0)):
                self.heal(key)  # each after its hold, the earliest first
            for line in heal_leftovers(self.ledger, self.run_id):
                self.errors.append(f"leftover healed: {line}")
        finally:
            for runner in self.runners:
                self.loop.call_soon_threadsafe(runner.stop)
            deadline = time.monotonic() + drain_s
            for fut in self.futures:
                try:
                    fut.result(timeout=max(0.1, deadline - time.monotonic()))
                except Exception as e:  # noqa: BLE001 - cancelled below, recorded
                    self.errors.append(f"load did not drain: {type(e).__name__}: {e}")
                    fut.cancel()
            self.monitor.cancel()
            try:  # let the cancelled tasks finish before the loop stops
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout=10)
            except Exception as e:  # noqa: BLE001 - recorded; the loop stops anyway
                self.errors.append(f"tasks did not end: {type(e).__name__}: {e}")
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            if not self.thread.is_alive():
                self.loop.close()
            self.history.close()
        return self.check(final=True)


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def heal_leftovers(ledger: Ledger, run_id: str) -> list[str]:
    """Heal ledger entries of this run only (another engineer's run on the
    same machine keeps its own faults): faults.heal_all's healer per entry,
    newest injection first."""
    lines = []
    for entry in reversed(ledger.pending()):
        if isinstance(entry, str) or entry.run_id != run_id:
            continue
        lines.append(heal_entry(entry))
        ledger.remove(entry.id)
    return lines


# ---------------------------------------------------------- a clean cluster

def served_name(cluster: Any) -> str:
    """The model name the cluster's replicas serve (--served-model-name)."""
    return getattr(getattr(cluster, "spec", None), "served_model_name", SERVED_MODEL_NAME)


def _answers(url: str, completion: bool, timeout: float,
             model: str = SERVED_MODEL_NAME) -> bool:
    try:
        if completion:
            body = json.dumps({"model": model, "prompt": "clean?", "max_tokens": 1,
                               "temperature": 0}).encode()
            req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
        else:
            req = urllib.request.Request(f"{url}/health")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def make_clean(cluster: Any, say: Say, ready_timeout_s: float = 300.0) -> list[str]:
    """Restart only the nodes that do not serve: a replica must answer a
    one-token completion directly (its /health alone can lie, which is the
    point of this suite), the router its /health. Healthy nodes are reused,
    so a clean-up after a healed fault costs a second, not a restart."""
    restarted = []
    for node in cluster.nodes:
        replica = getattr(node, "role", None) == "replica"
        if node.is_running() and _answers(node.endpoint.url, replica, 10.0,
                                          served_name(cluster)):
            continue
        say(f"explore: {node.name} does not serve after the heal; restarting it")
        if node.is_running():
            node.stop()
        node.start()
        node.wait_ready(ready_timeout_s)
        restarted.append(node.name)
    return restarted


def renumbered(steps: Sequence[Step]) -> list[Step]:
    """Steps as a file keeps them: times unchanged (already relative to the
    start of the load, warm-up included), sorted, keys renumbered from 0."""
    keys: dict[int, int] = {}
    out = []
    for s in sorted(steps, key=lambda s: (s.at_s, s.action != "heal")):
        k = keys.setdefault(s.key, len(keys))
        out.append(dataclasses.replace(s, key=k))
    return out
