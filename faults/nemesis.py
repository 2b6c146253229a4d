"""Running faults against a live workload and writing them into the history.

Each action is two ``info`` ops of process "nemesis" (Jepsen's convention):
one when it begins and one when it has taken effect, so checkers see the
exact window in which the fault was active. An action that fails is still
recorded (its end op carries the error) and the fault is healed anyway.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ordeal.history.ops import NEMESIS, utc_iso
from ordeal.history.writer import History

from .base import Fault
from .schedule import Step


@dataclass
class FaultWindow:
    kind: str
    target: str
    injected: str | None = None
    healed: str | None = None
    inject_result: dict[str, Any] = field(default_factory=dict)
    heal_result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    note: str | None = None  # e.g. healed by a resumed harness's clean-up

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _record(history: History, f: str, fault: Fault, action: Callable[[], dict[str, Any]]
            ) -> dict[str, Any]:
    """Run a nemesis action between its begin and end ops. An inject whose
    begin cannot be recorded is not done; a heal is done even when the
    history cannot be written (a full disk must not leave a fault in)."""
    def note(value: dict[str, Any], error: str | None = None) -> None:
        try:
            history.append("info", NEMESIS, f, value, error)
        except OSError:
            if f != "heal":
                raise
    note({"kind": fault.kind, "target": fault.target, "phase": "begin"})
    try:
        result = action()
    except Exception as e:
        # What the action did before it failed (FaultError.record) is kept.
        note({**getattr(e, "record", {}), "kind": fault.kind, "target": fault.target,
              "phase": "end"}, f"{type(e).__name__}: {e}")
        raise
    note({**result, "phase": "end"})
    return result


async def inject_then_heal(fault: Fault, history: History, after_s: float, hold_s: float,
                           progress: Callable[[str], None] | None = None) -> FaultWindow:
    """Wait ``after_s``, inject, hold ``hold_s``, heal: one fault window.
    Heal always runs, even if injection failed or the task is cancelled.
    Blocking actions run in a thread so the workload keeps going."""
    window = FaultWindow(fault.kind, fault.target)
    say = progress or (lambda _m: None)
    await asyncio.sleep(after_s)
    try:
        say(f"nemesis: inject {fault.kind} on {fault.target}")
        window.inject_result = await asyncio.to_thread(_record, history, "inject", fault,
                                                       fault.inject)
        window.injected = utc_iso()
        await asyncio.sleep(hold_s)
    except Exception as e:  # noqa: BLE001 - recorded, then we heal
        window.error = f"inject failed: {type(e).__name__}: {e}"
        window.inject_result = dict(getattr(e, "record", {}))
    finally:
        t0 = time.monotonic()
        say(f"nemesis: heal {fault.kind} on {fault.target}")
        try:
            window.heal_result = await asyncio.to_thread(_record, history, "heal", fault,
                                                         fault.heal)
            window.healed = utc_iso()
            say(f"nemesis: healed {fault.kind} on {fault.target} "
                f"in {time.monotonic() - t0:.1f}s")
        except Exception as e:  # noqa: BLE001
            window.error = (window.error or "") + f" heal failed: {type(e).__name__}: {e}"
            window.heal_result = dict(getattr(e, "record", {}))
    return window


async def _heal_window(fault: Fault, window: FaultWindow, history: History,
                       say: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    say(f"nemesis: heal {fault.kind} on {fault.target}")
    try:
        window.heal_result = await asyncio.to_thread(_record, history, "heal", fault, fault.heal)
        window.healed = utc_iso()
        say(f"nemesis: healed {fault.kind} on {fault.target} in {time.monotonic() - t0:.1f}s")
    except Exception as e:  # noqa: BLE001 - recorded in the window
        window.error = (window.error or "") + f" heal failed: {type(e).__name__}: {e}"
        window.heal_result = dict(getattr(e, "record", {}))


SLOW_ACTION_S = 1.0  # an action slower than this pushes the rest of a schedule back


async def run_schedule(steps: Sequence[Step], make: Callable[[Step], list[Fault]],
                       history: History, progress: Callable[[str], None] | None = None
                       ) -> list[FaultWindow]:
    """Execute a schedule (faults.schedule): at each step's time, inject the
    faults ``make`` builds for it, or heal those of its key. Whatever is
    still injected when the schedule ends, fails or is cancelled is healed in
    ``finally``: a schedule always ends healed."""
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    active: dict[int, list[tuple[Fault, FaultWindow]]] = {}
    windows: list[FaultWindow] = []
    lag = 0.0  # how far the schedule has been pushed back by slow actions
    previous_at, previous_allow = 0.0, 0.0
    try:
        for step in sorted(steps, key=lambda s: s.at_s):
            # A slow action (a restart that waited for readiness) pushes the
            # rest back by its time: every quiet period and hold keeps its
            # planned length, so each heal still has its after-heal window.
            # Time the plan itself left for the action (Step.allow_s) is not
            # paid twice: only the excess pushes.
            took = time.monotonic() - (t0 + lag + previous_at)  # the last action's time
            if took > previous_allow + SLOW_ACTION_S:
                lag += took - previous_allow
            previous_at, previous_allow = step.at_s, step.allow_s
            await asyncio.sleep(max(0.0, t0 + lag + step.at_s - time.monotonic()))
            if step.action == "heal":
                for fault, window in active.pop(step.key, []):
                    await _heal_window(fault, window, history, say)
                continue
            try:
                faults = make(step)
            except Exception as e:  # noqa: BLE001 - a bad step is recorded, the rest runs
                w = FaultWindow(step.kind, step.target, error=f"could not build: {e}")
                windows.append(w)
                history.append("info", NEMESIS, "inject", {"kind": step.kind,
                               "target": step.target, "phase": "refused"}, str(e))
                continue
            for fault in faults:
                window = FaultWindow(fault.kind, fault.target)
                windows.append(window)
                say(f"nemesis: inject {fault.kind} on {fault.target}")
                try:
                    window.inject_result = await asyncio.to_thread(
                        _record, history, "inject", fault, fault.inject)
                    window.injected = utc_iso()
                except Exception as e:  # noqa: BLE001
                    window.error = f"inject failed: {type(e).__name__}: {e}"
                    window.inject_result = dict(getattr(e, "record", {}))
                active.setdefault(step.key, []).append((fault, window))
    finally:
        for pairs in active.values():
            for fault, window in pairs:
                await _heal_window(fault, window, history, say)
    return windows
