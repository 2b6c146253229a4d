"""What the GPU did in each phase of a run, next to what the requests felt.

One pass over a history: the monitor's NVML readings (ops f "gpu", see
load.gpu_telemetry) and the requests are grouped by phase: "steady"
before any fault, each fault window ("gpu_throttle@triton-0"), and the
``after_heal_s`` after each heal ("after gpu_throttle@triton-0"); with
``warmup_s``, the load's first ``warmup_s`` (and what came before it) is
"warmup", not "steady", as the checkers see it (invariants.requests). Per phase:
SM clock (median, min), throttle reasons seen (bits and names), utilisation,
memory used, power, temperature, new XID events, and TTFT/TPOT/E2E
percentiles of the requests asked in it, plus errors. This is the table that
shows a throttle in NVML, its effect on latency, and the recovery after heal.
Pure: it reads ops only, and is bounded (a phase keeps at most
``MAX_VALUES`` values of each figure; phases past ``MAX_PHASES`` merge into
the last).
"""

from __future__ import annotations

from typing import Any, Iterable

from invariants.requests import WARMUP, Warmup
from ordeal.gpu import reason_names
from ordeal.history.ops import MONITOR, NEMESIS, Op
from ordeal.history.windows import CLOSED, FaultWindows

MAX_VALUES = 20_000
MAX_PHASES = 200


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


class _Phase:
    def __init__(self, name: str, t: float):
        self.name, self.t0, self.t1 = name, t, t
        self.req: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []}
        self.ok = self.fail = self.info = 0
        self.gpu: dict[str, list[float]] = {}
        self.bits = 0
        self.bits_seen: set[int] = set()
        self.xids: list[int] = []
        self.engine: dict[str, list[float]] = {}

    def add(self, bag: dict[str, list[float]], key: str, val: Any) -> None:
        if isinstance(val, (int, float)) and not isinstance(val, bool) and val >= 0:
            lst = bag.setdefault(key, [])
            if len(lst) < MAX_VALUES:
                lst.append(float(val))

    def to_dict(self) -> dict[str, Any]:
        g = self.gpu
        med = lambda k: _pct(g.get(k, []), 0.5)  # noqa: E731
        out: dict[str, Any] = {
            "phase": self.name, "from_s": round(self.t0, 1), "to_s": round(self.t1, 1),
            "requests_ok": self.ok, "requests_fail": self.fail, "requests_info": self.info,
            "ttft_ms_p50": _pct(self.req["ttft_ms"], 0.5),
            "ttft_ms_p90": _pct(self.req["ttft_ms"], 0.9),
            "tpot_ms_p50": _pct(self.req["tpot_ms"], 0.5),
            "tpot_ms_p90": _pct(self.req["tpot_ms"], 0.9),
            "e2e_ms_p50": _pct(self.req["e2e_ms"], 0.5),
        }
        if g:
            out["gpu"] = {
                "readings": len(g.get("sm_clock_mhz", [])),
                "sm_clock_mhz_median": med("sm_clock_mhz"),
                "sm_clock_mhz_min": min(g.get("sm_clock_mhz", [0]) or [0]),
                "sm_clock_max_mhz": max(g.get("sm_clock_max_mhz", [0]) or [0]),
                "reason_bits_seen": sorted(hex(b) for b in self.bits_seen),
                "reasons_seen": reason_names(self.bits),
                "util_gpu_pct_median": med("util_gpu_pct"),
                "mem_used_mb_min": min(g.get("mem_used_mb", [0]) or [0]),
                "mem_used_mb_max": max(g.get("mem_used_mb", [0]) or [0]),
                "power_w_median": med("power_w"),
                "temp_c_max": max(g.get("temp_c", [0]) or [0]),
                "xids": self.xids[:20],
            }
        if self.engine:
            out["engine"] = {k: {"min": min(v), "max": max(v)} for k, v in self.engine.items()}
        return out


def gpu_phases(ops: Iterable[Op], after_heal_s: float = 15.0,
               engine_metrics: tuple[str, ...] = ("nv_gpu_memory_used_bytes",),
               warmup_s: float = 0.0) -> dict[str, Any]:
    """Phases of a run with the GPU's and the requests' figures in each.
    ``engine_metrics``: metric names from the nodes' monitor samples to show
    per phase too (what the engine itself reported, e.g. Triton's own view of
    GPU memory). ``warmup_s``: the run's warm-up (``CheckerSettings.warmup_s``)."""
    phases: list[_Phase] = []
    t0: int | None = None
    faults = FaultWindows(gaps=False, keep=0)  # the open ones only
    warmup = Warmup(warmup_s)
    after_until: int | None = None
    after_label = ""
    asked: dict[Any, _Phase] = {}
    devices: dict[int, str] = {}
    note = None

    def at(ns: int) -> float:
        return (ns - (ns if t0 is None else t0)) / 1e9

    def current(ns: int) -> _Phase:
        if faults.open:
            name = " + ".join(sorted(faults.open))
        elif after_until is not None and ns <= after_until:
            name = f"after {after_label}"
        elif warmup.covers(ns):
            name = WARMUP
        else:
            name = "steady"
        if not phases or phases[-1].name != name:
            if len(phases) < MAX_PHASES:
                phases.append(_Phase(name, at(ns)))
        ph = phases[-1]
        ph.t1 = at(ns)
        return ph

    for op in ops:
        if t0 is None:
            t0 = op.time_ns
        v = op.value if isinstance(op.value, dict) else {}
        warmup.feed(op)
        if op.process == NEMESIS:
            change = faults.feed(op)
            if change is not None and change.what == CLOSED:
                after_until = op.time_ns + int(after_heal_s * 1e9)
                after_label = change.window.key
            current(op.time_ns)
            continue
        if op.process == MONITOR:
            if op.f == "gpu":
                gpu = v.get("gpu")
                if not isinstance(gpu, dict):
                    note = note or v.get("reason")
                    continue
                devices[int(v.get("device", 0))] = str(v.get("name", ""))
                ph = current(op.time_ns)
                for k, val in gpu.items():
                    ph.add(ph.gpu, k, val)
                bits = gpu.get("clocks_event_reasons")
                if isinstance(bits, int) and bits >= 0:
                    ph.bits |= bits
                    ph.bits_seen.add(bits)
                ph.xids.extend(int(x) for x in v.get("xids") or [])
            elif op.f in ("sample", "drain"):
                m = v.get("metrics") or {}
                ph = current(op.time_ns)
                for name in engine_metrics:
                    if name in m:
                        ph.add(ph.engine, f"{v.get('node')} {name}", m[name])
            continue
        if op.type == "invoke":
            asked[op.process] = current(op.time_ns)
            continue
        ph = asked.pop(op.process, None)
        if ph is None:
            continue
        if op.type == "ok":
            ph.ok += 1
            for k in ph.req:
                ph.add(ph.req, k, v.get(k))
        elif op.type == "fail":
            ph.fail += 1
        else:
            ph.info += 1
    out: dict[str, Any] = {"after_heal_s": after_heal_s,
                           **({"warmup_s": warmup_s} if warmup_s > 0 else {}),
                           "devices": {str(k): n for k, n in sorted(devices.items())},
                           "phases": [p.to_dict() for p in phases]}
    if note and not devices:
        out["note"] = note
    return out


def throttle_effect(phases: list[dict[str, Any]], kind: str = "gpu_throttle") -> list[dict[str, Any]]:
    """For each window of ``kind``: the steady phase before it, the window and
    the phase after its heal, side by side (SM clock, reasons, TTFT, TPOT)."""
    out = []
    for i, p in enumerate(phases):
        if not p["phase"].startswith(kind):
            continue
        before = next((q for q in reversed(phases[:i]) if q["phase"] == "steady"), None)
        after = next((q for q in phases[i + 1:] if q["phase"] == f"after {p['phase']}"), None)

        def brief(q: dict[str, Any] | None) -> dict[str, Any] | None:
            if q is None:
                return None
            g = q.get("gpu") or {}
            return {"sm_clock_mhz_median": g.get("sm_clock_mhz_median"),
                    "sm_clock_mhz_min": g.get("sm_clock_mhz_min"),
                    "reason_bits_seen": g.get("reason_bits_seen"),
                    "reasons_seen": g.get("reasons_seen"),
                    "ttft_ms_p50": q.get("ttft_ms_p50"), "tpot_ms_p50": q.get("tpot_ms_p50"),
                    "e2e_ms_p50": q.get("e2e_ms_p50"), "requests_ok": q.get("requests_ok")}
        out.append({"window": p["phase"], "before": brief(before), "during": brief(p),
                    "after": brief(after)})
    return out
