"""The judge of an endurance run: a thread that tails history.jsonl as it is
written, feeds every op once to the streaming checkers, prints progress,
writes interim.json (and an interim report.html) and watches the stop
condition. runs/endurance.py starts it and runs the final check."""

from __future__ import annotations

import copy
import os
import threading
import time
import tracemalloc
from collections import Counter, deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from faults.nemesis import FaultWindow
from invariants import DEFAULT_CHECKERS, RunContext
from invariants.base import Result, not_judgeable
from load import heap
from ordeal.history.ops import HARNESS, MONITOR, Op
from ordeal.history.reader import HistoryTail
from ordeal.history.windows import INJECTED, FaultWindows, Window
from reports.html_interim import MAX_INTERIM_FAULTS, render_interim
from reports.run_dir import write_json_atomic
from runs.endurance_plan import EndurancePlan, EnduranceState

INTERIM_NAME = "interim.json"

harness_rss_mb = heap.rss_mb


def os_threads() -> int:
    """The harness's threads as the kernel counts them (Python's own and
    those of native libraries), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class Judge:
    """Judges the run while it goes, from history.jsonl as written: a thread
    follows it (``HistoryTail``: each chunk once sealed and verified) and
    feeds every op once to streaming checkers, so memory stays bounded by
    the checkers' own (in-flight) state. Every
    ``interim_every_s`` it writes interim.json; every ``progress_every_s`` it
    prints a line; it decides the stop condition on the current segment's
    client completions. A resumed run's judge starts at the beginning of
    the file, so the figures cover both halves."""

    MAX_WINDOWS = 20000  # ~ a fault a minute for two weeks

    def __init__(self, history_path: Path, run_dir: Path, plan: EndurancePlan,
                 ctx: RunContext, say: Callable[[str], None], live_from_index: int = 0,
                 position_s: float = 0.0, checkers: Sequence[Any] | None = None):
        self.path = Path(history_path)
        self.run_dir = Path(run_dir)
        self.plan = plan
        self.ctx = ctx
        self.say = say
        self.live_from_index = live_from_index
        self.position_s = position_s
        self.checkers = list(checkers) if checkers is not None else [c() for c in
                                                                       DEFAULT_CHECKERS]
        for c in self.checkers:
            c.start(ctx)
        self.failed_checkers: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.damage = 0  # damaged lines or chunks the tail reported (the final check names them)
        self.tail = HistoryTail(self.path, on_error=self._damaged, on_note=lambda _m: None)
        self.faults = FaultWindows(keep=self.MAX_WINDOWS)
        self.exercised: Counter[str] = Counter()
        self.gaps: list[dict[str, Any]] = []
        self.recent: deque[tuple[int, bool]] = deque()  # (time_ns, failed) of live completions
        self.breach_since_ns: int | None = None
        self.stop_reason: str | None = None
        self.rss: list[tuple[float, float]] = []  # (seconds into this segment, MB)
        # (wall time, RSS MB, open fds, threads) of the harness, for the drift
        # figures (wall time, so a resumed run's segments line up)
        self.harness: list[tuple[float, float, int, int]] = []
        self.heap: dict[str, Any] = {}  # the latest sample_rss's figures
        self.t0 = time.monotonic()
        # ORDEAL_TRACEMALLOC=1: interim.json also lists the lines holding the
        # most memory (slows the harness; for finding a leak).
        self.trace = bool(os.environ.get("ORDEAL_TRACEMALLOC"))
        if self.trace and not tracemalloc.is_tracing():
            tracemalloc.start(4)
        self._trace_base: tracemalloc.Snapshot | None = None
        #: Called with the interim results each time interim.json is written
        #: (the run's live metrics, runs/live_metrics.py).
        self.on_interim: Callable[[list[Result]], None] | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ordeal-judge", daemon=True)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, read what is left (the writer is done: its
        unsealed tail too), write the last interim file."""
        self._halt.set()
        self._thread.join(timeout=60)
        for op in self.tail.read_rest():
            self.feed(op)
        self.write_interim()

    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def _loop(self) -> None:
        next_interim = time.monotonic() + self.plan.interim_every_s
        next_progress = time.monotonic() + self.plan.progress_every_s
        while not self._halt.wait(0.5):
            try:
                self.read_new()
                now = time.monotonic()
                if now >= next_progress:
                    next_progress = now + self.plan.progress_every_s
                    self.say(self.progress_line())
                    heap.trim()  # the line's copy of the checkers is garbage now
                if now >= next_interim:
                    next_interim = now + self.plan.interim_every_s
                    self.write_interim()
            except Exception as e:  # noqa: BLE001 - the judge must not kill the run
                self.say(f"endurance: judge error (the run goes on; the final check reads "
                         f"the whole history again): {type(e).__name__}: {e}")

    # -- reading ----------------------------------------------------------------
    def read_new(self) -> int:
        """Feed the ops of every chunk sealed since the last call."""
        n = 0
        for op in self.tail.read_new():
            self.feed(op)
            n += 1
        return n

    def _damaged(self, _msg: str) -> None:
        self.damage += 1

    def feed(self, op: Op) -> None:
        for c in self.checkers:
            if c.name in self.failed_checkers:
                continue
            try:
                c.feed(op)
            except Exception as e:  # noqa: BLE001 - judged again at the end
                self.failed_checkers[c.name] = f"{type(e).__name__}: {e}"
        change = self.faults.feed(op)  # a gap ends the open ones: heal-all healed them
        if change is not None and change.what == INJECTED:
            self.exercised[change.window.kind] += 1
        if op.process in HARNESS:
            if op.process == MONITOR and op.f == "gap":
                self.gaps.append(dict(op.value))
            return
        self.counts[op.type] += 1
        if op.type != "invoke" and op.index >= self.live_from_index:
            self._stop_condition(op)

    def _stop_condition(self, op: Op) -> None:
        stop = self.plan.stop
        self.recent.append((op.time_ns, op.type != "ok"))
        horizon = op.time_ns - int(stop.window_s * 1e9)
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()
        if len(self.recent) < stop.min_requests:
            return
        rate = sum(bad for _, bad in self.recent) / len(self.recent)
        if rate <= stop.max_error_rate:
            self.breach_since_ns = None
            return
        if self.breach_since_ns is None:
            self.breach_since_ns = op.time_ns
        if op.time_ns - self.breach_since_ns >= stop.grace_s * 1e9 and self.stop_reason is None:
            self.stop_reason = (f"stop condition: {rate:.0%} of requests failed over the last "
                                f"{stop.window_s:.0f}s, above {stop.max_error_rate:.0%} for "
                                f"{stop.grace_s:.0f}s (--stop-error-rate, --stop-grace)")
            self.say(f"endurance: {self.stop_reason}; stopping and healing everything")

    # -- reporting --------------------------------------------------------------
    def results(self) -> list[Result]:
        """The invariants so far, without disturbing the running checkers."""
        out = []
        for c in self.checkers:
            if c.name in self.failed_checkers:
                out.append(Result(c.name, "unknown", {"error": self.failed_checkers[c.name]}))
                continue
            try:
                # A copy costs as much as the checker's state, every progress
                # line; a checker whose result only reads is asked directly.
                live = c if c.pure_result else copy.deepcopy(c)
                out.append(not_judgeable(c, settled_so_far(live.result()), self.ctx))
            except Exception as e:  # noqa: BLE001
                out.append(Result(c.name, "unknown", {"error": f"{type(e).__name__}: {e}"}))
        return out

    def elapsed_s(self) -> float:
        return self.position_s + time.monotonic() - self.t0

    def progress_line(self) -> str:
        results = self.results()
        false = [r.name for r in results if r.valid is False]
        elapsed, total = self.elapsed_s(), self.plan.run_s
        active = ", ".join(f"{w.kind} on {w.target}" for w in self.faults.open.values()) or "none"
        unknown = sum(1 for r in results if r.valid not in (True, False))
        verdict = (f"FALSE: {', '.join(false)}" if false else
                   f"none false ({len(results) - unknown} true, {unknown} not yet judged)")
        c, pct = self.counts, min(100, 100 * elapsed / total)
        return (f"endurance {fmt_s(elapsed)}/{fmt_s(total)} ({pct:.0f}%),"
                f" ops {c['invoke']} (ok {c['ok']}, fail {c['fail']}, info {c['info']}), fault: "
                f"{active}, kinds {len(self.exercised)}/{len(self.plan.kinds)}, "
                f"invariants so far {verdict}, harness RSS {harness_rss_mb():.0f} MB")

    def sample_rss(self) -> None:
        """RSS after handing malloc's free pages back (``load.heap``),
        with malloc's own figures and what the trim gave back."""
        before = harness_rss_mb()
        heap.trim()
        t, parts = round(time.monotonic() - self.t0, 1), heap.rss_parts_mb()
        after = parts.get("VmRSS", 0.0)
        if len(self.rss) < 2000:
            self.rss.append((t, round(after, 2)))
        if len(self.harness) < 20000:
            self.harness.append((round(time.time(), 1), round(after, 2),
                                 len(os.listdir("/proc/self/fd")), os_threads()))
        self.heap = {"at_s": t, "rss_before_trim_mb": round(before, 2),
                     "rss_mb": round(after, 2),
                     "rss_anon_mb": round(parts.get("RssAnon", 0.0), 2),
                     "rss_file_mb": round(parts.get("RssFile", 0.0), 2),
                     **(heap.malloc_figures() or {})}

    def write_interim(self) -> None:
        self.sample_rss()
        results = self.results()
        if self.on_interim is not None:
            self.on_interim(results)
        doc = {
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "elapsed_s": round(self.elapsed_s(), 1), "run_s": self.plan.run_s,
            "ops": dict(self.counts),
            "active_faults": [[w.kind, w.target] for w in self.faults.open.values()],
            "kinds_exercised": dict(self.exercised), "stop_reason": self.stop_reason,
            "harness_rss_mb": self.rss[-20:], "history_damage": self.damage,
            "invariants": [r.to_dict() for r in results],
            "threads": threading.active_count(), "heap": self.heap,
            **(self.trace_report() if self.trace else {})}
        write_json_atomic(self.run_dir / INTERIM_NAME, doc)
        # report.html marked interim, from the same figures (never raises);
        # the run's end writes the final one over it.
        render_interim(self.run_dir, doc, [asdict(summary_window(w)) for w in
                                           self.faults.windows[-MAX_INTERIM_FAULTS:]])

    def trace_report(self) -> dict[str, Any]:
        """ORDEAL_TRACEMALLOC=1: what Python holds now, and what grew since
        the first interim file (a leak shows in the growth, not the top)."""
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        if self._trace_base is None:
            self._trace_base = snap
        current, peak = tracemalloc.get_traced_memory()
        return {"tracemalloc_traced_mb": round(current / 2**20, 2),
                "tracemalloc_peak_mb": round(peak / 2**20, 2),
                "tracemalloc_top": [str(st) for st in snap.statistics("lineno")[:25]],
                "tracemalloc_growth": [
                    f"{st.size_diff / 1024:+.1f} KiB ({st.count_diff:+d} blocks) at "
                    + " -> ".join(f"{fr.filename}:{fr.lineno}" for fr in st.traceback)
                    for st in snap.compare_to(self._trace_base, "traceback")[:15]]}

    def section(self, state: EnduranceState) -> dict[str, Any]:
        """summary.json's ``endurance`` key."""
        missing = [k for k in self.plan.kinds if not self.exercised.get(k)]
        return {"plan": self.plan.to_dict(), "segments": state.segments, "gaps": self.gaps,
                "kinds_exercised": dict(self.exercised), "kinds_missing": missing,
                "stopped": self.stop_reason, "harness_rss_mb": self.rss,
                "harness_samples": self.harness,
                "faults_total": len(self.faults.windows)}

    def fault_windows(self) -> list[dict[str, Any]]:
        """summary.json's ``faults``: the windows as the nemesis records them."""
        return [asdict(summary_window(w)) for w in self.faults.windows]


def summary_window(w: Window) -> FaultWindow:
    """A window of the history as a summary's fault (``faults.nemesis``);
    the action results stay in the history."""
    error = w.inject_error
    if w.heal_error:
        error = (error or "") + f" heal: {w.heal_error}"
    return FaultWindow(w.kind, w.target, injected=w.injected_wall, healed=w.end_wall, error=error,
                       note="healed by the resumed harness's clean-up" if w.ended_by_gap else None)


def settled_so_far(r: Result) -> Result:
    """A checker's result mid-run, without what only the end can settle: a
    request still in flight is not lost yet, and a fault still injected has
    not failed to recover yet. The final check judges both for real."""
    if r.name == "no_silent_loss" and r.valid is False:
        d = r.details
        if not any(d.get(k) for k in ("completion_without_invoke", "invoke_while_open")):
            return Result(r.name, True, {**d, "in_flight": d.get("never_completed", 0),
                                         "never_completed": 0})
    if r.name == "recovery" and r.valid is False:
        windows = r.details.get("windows", {})
        if all(w.get("recovered") is not False or w.get("why") == "never healed"
               for w in windows.values()):
            return Result(r.name, True, {**r.details, "note": "a fault is still injected"})
    return r


def fmt_s(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
