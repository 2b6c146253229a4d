"""Qualification against a baseline run: does this run regress on an earlier
one (a previous release, the same suite and workload)?

Pure: reads files, starts nothing. Three entry points:

- ``load_baseline(run_dir)``: an earlier run's summary.json, checked;
  ``BaselineError`` (a ``ConfigError``) says which path and what to do.
- ``compare(current, baseline, thresholds) -> Comparison``: per invariant and
  per SLO figure, with a threshold each; ``Comparison.to_dict()``.
- ``apply_baseline(summary, baseline_dir, thresholds_path)``: adds
  ``summary["baseline"]`` and ``summary["qualification"]`` (for the run's
  finish); never raises.

Invariants. A regression is an invariant whose baseline ``valid`` is true and
whose current ``valid`` is false. True -> "unknown" is a regression too by
default (the run no longer shows what the baseline showed: a qualification
wants at least the baseline's evidence), and so is an invariant true in the
baseline and missing from the current run; ``[invariants]`` turns either off
(then it is reported, not counted). Baseline false or unknown -> anything is
never a regression; false/unknown -> true is an improvement. An invariant
only in the current run is listed as not compared.

Figures. A flat dict of numbers taken from the invariants' details, each
lower- or higher-is-better (``extract_figures``):

- ``slo_latency.<window>.<metric>.<pct>``: metric ttft_ms, tpot_ms, itl_ms,
  e2e_ms; pct from ``[latency] percentiles``; window ``steady``,
  ``fault:<kind>@<target>#<n>`` or ``after_heal:<kind>@<target>#<n>``.
  Lower is better.
- ``goodput.<window>`` (higher), ``error_rate.<window>`` (lower),
  ``availability.fault:<label>`` (higher): shares 0..1.
- ``recovery.after_heal:<label>.recovery_s`` and
  ``restart_readiness.<target>#<n>.ready_after_s``: seconds, lower.
- ``leak_bound.<node>.drained_mb``: memory after the drain, lower.

The warm-up (``CheckerSettings.warmup_s``, window ``warmup``) gives no
figure: it is what a run leaves out of its steady state. Two runs with
different warm-ups are compared with a warning.

A latency, seconds or memory figure regresses when it is worse by more than
its relative threshold AND by more than its absolute floor (tiny CPU
latencies are noisy in relative terms); a share regresses when it is worse by
more than its absolute margin. Better by as much is an improvement; the rest
is unchanged. A figure in only one run, or null in one, is listed as not
compared with the reason, never dropped.

Sample size. A percentile of few samples is one or two requests: the p99 of
80 requests is their maximum, and two runs of one build differ there by 3x on
a loaded machine. A latency percentile pXX is compared only when both runs
have at least ``min_tail_samples`` samples above it, i.e. at least
``min_tail_samples / (1 - XX/100)`` samples (p99: 500, p90: 50, p50: 10 with
the default 5); ``mean`` needs ``min_tail_samples`` samples; ``min`` and
``max`` are single samples, compared only with ``min_tail_samples = 0``.
Otherwise the figure is listed as not compared, with the counts.

Thresholds file (TOML; every key optional, unknown keys are an error)::

    ignore = []                 # fnmatch patterns of figure/invariant names
    [latency]                   # slo_latency figures, milliseconds
    relative = 0.20
    absolute_ms = 5.0
    percentiles = ["p50", "p90", "p99"]
    phases = ["steady", "fault", "after_heal"]
    min_tail_samples = 5.0      # see "Sample size" below; 0 compares every figure
    [seconds]                   # recovery_s, ready_after_s
    relative = 0.50
    absolute_s = 10.0
    [memory]                    # leak_bound drained_mb
    relative = 0.20
    absolute_mb = 256.0
    [rates]                     # absolute margins on shares (0.01 = 1 pp)
    error_rate = 0.01
    goodput = 0.01
    availability = 0.01
    [invariants]
    unknown_is_regression = true
    missing_is_regression = true
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from invariants.requests import WARMUP
from ordeal.config import ConfigError

from .summary import SCHEMA_VERSION
from .thresholds import Thresholds, load_thresholds

Better = Literal["lower", "higher"]


Status = Literal["regressed", "improved", "unchanged"]


LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


class BaselineError(ConfigError):
    """A baseline (or the run compared with it) that cannot be used; the
    message names the path and what to do."""


# ------------------------------------------------------------------ summaries


def check_summary(data: Any, path: Path | str, role: str = "baseline") -> dict[str, Any]:
    """``data`` if it is a summary this module can compare; otherwise a
    ``BaselineError`` naming ``path`` and what is wrong."""
    if not isinstance(data, dict):
        raise BaselineError(f"{role} {path}: not a summary (a JSON object was expected)")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise BaselineError(f"{role} {path}: summary schema {schema!r}, this Ordeal reads "
                            f"schema {SCHEMA_VERSION}; use a run made by this version")
    invs = data.get("invariants")
    if not isinstance(invs, list) or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) for i in invs):
        raise BaselineError(f"{role} {path}: 'invariants' is not a list of named results")
    if not invs:
        raise BaselineError(f"{role} {path}: the run has no invariants to compare (did it "
                            "stop before its check, or is it an exploration run?); "
                            "choose a finished run of the same suite")
    return data


def load_baseline(run_dir: str | Path, role: str = "baseline") -> dict[str, Any]:
    """An earlier run's summary.json (``run_dir`` is the run directory, or
    the summary.json itself), checked with ``check_summary``."""
    p = Path(run_dir)
    path = p if p.suffix == ".json" and not p.is_dir() else p / "summary.json"
    if not path.parent.is_dir():
        raise BaselineError(f"{role} {p}: no such directory; give an earlier run's "
                            "directory, e.g. reports/runs/<run id> "
                            "(`python -m reports list` lists them)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise BaselineError(f"{role} {path} is missing: the {role} must be a finished "
                            "run's directory, one holding summary.json") from e
    except (OSError, ValueError) as e:
        raise BaselineError(f"{role} {path} is unreadable ({type(e).__name__}: {e}); "
                            "choose another run") from e
    if isinstance(data, dict) and data.get("kind") == "session":
        runs = ", ".join(r.get("run_id", "?") for r in data.get("runs", []))
        raise BaselineError(f"{role} {path} is a session summary (several runs merged), not "
                            f"one run; name one of its runs instead: {runs}")
    return check_summary(data, path, role)


# -------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None
    better: Better
    kind: str  # latency_ms | seconds | memory_mb | error_rate | goodput | availability
    samples: int | None = None  # latency percentiles: the window's sample count
    pct: str | None = None  # latency percentiles: p50, p99, mean, ...


def samples_needed(pct: str, min_tail: float) -> float:
    """How many samples a percentile needs to rest on ``min_tail`` samples
    above it (module docstring, "Sample size")."""
    if min_tail <= 0:
        return 0.0
    if pct == "mean":
        return min_tail
    if pct in ("min", "max"):
        return math.inf
    tail = 1.0 - float(pct[1:]) / 100.0
    return math.ceil(min_tail / tail - 1e-9)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _window_name(key: str, phase: Any) -> str:
    """steady, fault:<label>, after_heal:<label> (the summaries key fault
    windows by their bare label)."""
    if key == "steady" or key.startswith("after_heal:"):
        return key
    return f"{phase or 'fault'}:{key}"


def _phase_of(window: str) -> str:
    return window.split(":", 1)[0]


def extract_figures(summary: dict[str, Any],
                    thresholds: Thresholds | None = None) -> dict[str, Figure]:
    """The comparable figures of a summary, by name (see module docstring).
    Unknown shapes are skipped: a figure absent here is reported by
    ``compare`` when the other run has it."""
    t = thresholds or Thresholds()
    out: dict[str, Figure] = {}

    def add(name: str, value: Any, better: Better, kind: str,
            samples: int | None = None, pct: str | None = None) -> None:
        out[name] = Figure(name, _num(value), better, kind, samples, pct)

    for inv in summary.get("invariants") or []:
        if not isinstance(inv, dict) or not isinstance(inv.get("details"), dict):
            continue
        name, d = inv.get("name"), inv["details"]
        windows = d.get("windows") if isinstance(d.get("windows"), dict) else {}
        windows = {k: w for k, w in windows.items()  # the warm-up: not steady, not compared
                   if not (isinstance(w, dict) and w.get("phase") == WARMUP)}
        if name == "slo_latency":
            for key, w in windows.items():
                if not isinstance(w, dict):
                    continue
                win = _window_name(key, w.get("phase"))
                if _phase_of(win) not in t.latency.phases:
                    continue
                for m in LATENCY_METRICS:
                    h = w.get(m)
                    if not isinstance(h, dict) or not h.get("count"):
                        continue  # no sample: the window shows as not compared below
                    for pct in t.latency.percentiles:
                        add(f"slo_latency.{win}.{m}.{pct}", h.get(pct), "lower", "latency_ms",
                            int(h["count"]), pct)
        elif name in ("goodput", "error_rate"):
            for key, w in windows.items():
                if isinstance(w, dict):
                    add(f"{name}.{_window_name(key, w.get('phase'))}", w.get(name),
                        "higher" if name == "goodput" else "lower", name)
        elif name == "availability":
            for key, w in windows.items():
                if isinstance(w, dict):
                    add(f"availability.{_window_name(key, 'fault')}", w.get("availability"),
                        "higher", "availability")
        elif name == "recovery":
            for key, w in windows.items():
                if isinstance(w, dict):
                    add(f"recovery.after_heal:{key}.recovery_s", w.get("recovery_s"),
                        "lower", "seconds")
        elif name == "restart_readiness":
            seen: dict[str, int] = {}
            for r in d.get("restarts") or []:
                if isinstance(r, dict):
                    target = str(r.get("target"))
                    seen[target] = seen.get(target, 0) + 1
                    add(f"restart_readiness.{target}#{seen[target]}.ready_after_s",
                        r.get("ready_after_s"), "lower", "seconds")
        elif name == "leak_bound":
            nodes = d.get("nodes") if isinstance(d.get("nodes"), dict) else {}
            for node, n in nodes.items():
                if isinstance(n, dict) and "drained_mb" in n:
                    add(f"leak_bound.{node}.drained_mb", n.get("drained_mb"), "lower",
                        "memory_mb")
    return out


# ----------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Threshold:
    """Worse by more than ``absolute`` (and, where set, by more than
    ``relative`` times the baseline) is a regression."""

    absolute: float
    relative: float | None = None
    unit: str = ""

    def describe(self) -> str:
        unit = self.unit if self.unit in ("ms", "s", "MB") else ""
        amount = (f"{self.absolute * 100:g} pp" if self.unit == "share"
                  else f"{self.absolute:g}{' ' + unit if unit else ''}")
        if self.relative is None:
            return f"worse by > {amount}"
        return f"worse by > {self.relative:.0%} and > {amount}"


def threshold_for(kind: str, t: Thresholds) -> Threshold:
    if kind == "latency_ms":
        return Threshold(t.latency.absolute_ms, t.latency.relative, "ms")
    if kind == "seconds":
        return Threshold(t.seconds.absolute_s, t.seconds.relative, "s")
    if kind == "memory_mb":
        return Threshold(t.memory.absolute_mb, t.memory.relative, "MB")
    return Threshold(getattr(t.rates, kind), None, "share")


@dataclass(frozen=True)
class FigureChange:
    name: str
    kind: str
    better: Better
    baseline: float
    current: float
    change: float  # current - baseline
    relative_change: float | None  # change / baseline; None when the baseline is 0
    threshold: str
    status: Status

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.name, "kind": self.kind, "better": self.better,
                "baseline": self.baseline, "current": self.current,
                "change": round(self.change, 6),
                "relative_change": None if self.relative_change is None
                else round(self.relative_change, 4),
                "threshold": self.threshold, "status": self.status}


@dataclass(frozen=True)
class InvariantChange:
    name: str
    baseline: Any  # True, False, "unknown"
    current: Any  # True, False, "unknown", or "missing"
    status: Status | Literal["reported"]
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"figure": f"invariant:{self.name}", "kind": "invariant",
                "baseline": self.baseline, "current": self.current,
                "change": f"{_valid_str(self.baseline)} -> {_valid_str(self.current)}",
                "threshold": self.why, "status": self.status}


@dataclass(frozen=True)
class NotCompared:
    name: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.name, "why": self.why}


@dataclass
class Comparison:
    current_run: str
    baseline_run: str
    thresholds: Thresholds
    invariants: list[InvariantChange] = field(default_factory=list)
    figures: list[FigureChange] = field(default_factory=list)
    not_compared: list[NotCompared] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[InvariantChange | FigureChange]:
        return ([i for i in self.invariants if i.status == "regressed"]
                + [f for f in self.figures if f.status == "regressed"])

    @property
    def improvements(self) -> list[InvariantChange | FigureChange]:
        return ([i for i in self.invariants if i.status == "improved"]
                + [f for f in self.figures if f.status == "improved"])

    @property
    def unchanged(self) -> int:
        return (sum(i.status == "unchanged" for i in self.invariants)
                + sum(f.status == "unchanged" for f in self.figures))

    @property
    def verdict(self) -> Literal["pass", "regressed"]:
        return "regressed" if self.regressions else "pass"

    def to_dict(self) -> dict[str, Any]:
        reported = [i for i in self.invariants if i.status == "reported"]
        return {
            "verdict": self.verdict,
            "current_run": self.current_run,
            "baseline_run": self.baseline_run,
            "regressions": [r.to_dict() for r in self.regressions],
            "improvements": [r.to_dict() for r in self.improvements],
            "improved": len(self.improvements),
            "unchanged": self.unchanged,
            "compared": {"invariants": len(self.invariants), "figures": len(self.figures)},
            "reported": [r.to_dict() for r in reported],
            "not_compared": [n.to_dict() for n in self.not_compared],
            "warnings": list(self.warnings),
            "thresholds": self.thresholds.to_dict(),
        }


def _valid_str(v: Any) -> str:
    return {True: "true", False: "false"}.get(v, str(v)) if isinstance(v, bool) else str(v)


def _valid(v: Any) -> Any:
    return v if isinstance(v, bool) else "unknown"


def _compare_invariant(name: str, base: Any, cur: Any, t: Thresholds) -> InvariantChange:
    rules = t.invariants
    if base is True and cur is False:
        return InvariantChange(name, base, cur, "regressed", "held in the baseline, fails now")
    if base is True and cur == "missing":
        why = "held in the baseline, not checked in this run"
        return InvariantChange(name, base, cur,
                               "regressed" if rules.missing_is_regression else "reported", why)
    if base is True and cur is not True:
        why = "held in the baseline, cannot be judged now"
        return InvariantChange(name, base, cur,
                               "regressed" if rules.unknown_is_regression else "reported", why)
    if base is not True and cur is True:
        return InvariantChange(name, base, cur, "improved", "holds now, did not in the baseline")
    if base is not True:
        return InvariantChange(name, base, cur, "unchanged",
                               "did not hold in the baseline either")
    return InvariantChange(name, base, cur, "unchanged", "holds in both")


def _compare_figure(b: Figure, c: Figure, t: Thresholds) -> FigureChange:
    th = threshold_for(b.kind, t)
    assert b.value is not None and c.value is not None
    change = c.value - b.value
    worse = change if b.better == "lower" else -change
    rel = change / abs(b.value) if b.value else None

    def beyond(amount: float) -> bool:
        if amount <= th.absolute + 1e-12:
            return False
        return th.relative is None or amount > th.relative * abs(b.value) + 1e-12

    status: Status = "regressed" if beyond(worse) else "improved" if beyond(-worse) \
        else "unchanged"
    return FigureChange(b.name, b.kind, b.better, b.value, c.value, change, rel,
                        th.describe(), status)


def _too_few_samples(b: Figure, c: Figure, t: Thresholds) -> str | None:
    """Why a latency percentile rests on too few samples to compare, or None."""
    if b.pct is None or b.samples is None or c.samples is None:
        return None
    need = samples_needed(b.pct, t.latency.min_tail_samples)
    if b.samples >= need and c.samples >= need:
        return None
    counts = f"{b.samples} samples in the baseline, {c.samples} in this run"
    if math.isinf(need):
        return (f"{counts}: {b.pct} is a single sample; compared only with "
                "[latency] min_tail_samples = 0")
    return (f"{counts}: {b.pct} needs {need:g} for {t.latency.min_tail_samples:g} samples "
            "beyond it ([latency] min_tail_samples); run longer or compare a lower percentile")


def _ignored(name: str, t: Thresholds) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in t.ignore)


def _comparability(current: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Warnings when the two runs did not run the same thing: the comparison
    is still made, but its figures mean less."""
    out = []
    if current.get("suite") != baseline.get("suite"):
        out.append(f"different suites: {current.get('suite')!r} vs baseline "
                   f"{baseline.get('suite')!r}")
    wc, wb = current.get("workload") or {}, baseline.get("workload") or {}
    if isinstance(wc, dict) and isinstance(wb, dict):
        diff = sorted(k for k in set(wc) | set(wb) if wc.get(k) != wb.get(k))
        if diff:
            out.append("different workloads: " + ", ".join(
                f"{k}={wc.get(k)!r} (baseline {wb.get(k)!r})" for k in diff[:8]))

    def plan(s: dict[str, Any]) -> list[Any]:
        return [(e.get("at_s"), e.get("action"), e.get("kind"), e.get("target"))
                for e in s.get("schedule") or [] if isinstance(e, dict)]
    if plan(current) != plan(baseline):
        out.append("different fault schedules: window figures may not line up")

    def warmup(s: dict[str, Any]) -> Any:
        settings = s.get("settings")
        return settings.get("warmup_s", 0.0) if isinstance(settings, dict) else 0.0
    if warmup(current) != warmup(baseline):
        out.append(f"different warm-ups: warmup_s={warmup(current)!r} (baseline "
                   f"{warmup(baseline)!r}): steady figures leave out different requests")
    return out


def compare(current: dict[str, Any], baseline: dict[str, Any],
            thresholds: Thresholds | None = None) -> Comparison:
    """Compare a run's summary with a baseline's (both summary dicts, as in
    summary.json). See the module docstring for the rules."""
    t = thresholds or Thresholds()
    check_summary(current, current.get("run_id", "?") if isinstance(current, dict) else "?",
                  "run")
    check_summary(baseline, baseline.get("run_id", "?"), "baseline")
    cmp = Comparison(str(current.get("run_id", "?")), str(baseline.get("run_id", "?")), t,
                     warnings=_comparability(current, baseline))

    inv_b = {i["name"]: i.get("valid") for i in baseline["invariants"]}
    inv_c = {i["name"]: i.get("valid") for i in current["invariants"]}
    for name, vb in inv_b.items():
        key = f"invariant:{name}"
        if _ignored(key, t) or _ignored(name, t):
            cmp.not_compared.append(NotCompared(key, "ignored by the thresholds file"))
            continue
        vc = _valid(inv_c[name]) if name in inv_c else "missing"
        cmp.invariants.append(_compare_invariant(name, _valid(vb), vc, t))
    for name in inv_c:
        if name not in inv_b:
            cmp.not_compared.append(NotCompared(f"invariant:{name}",
                                                "not in the baseline (a new check)"))

    fb, fc = extract_figures(baseline, t), extract_figures(current, t)
    for name in list(fb) + [n for n in fc if n not in fb]:
        b, c = fb.get(name), fc.get(name)
        if _ignored(name, t):
            why = "ignored by the thresholds file"
        elif c is None:
            why = "only in the baseline (this run has no such window or figure)"
        elif b is None:
            why = "only in this run (the baseline has no such window or figure)"
        elif b.value is None or c.value is None:
            side = "baseline" if b.value is None else "this run"
            why = f"no value in {'both runs' if b.value is None and c.value is None else side}"
        elif (few := _too_few_samples(b, c, t)) is not None:
            why = few
        else:
            cmp.figures.append(_compare_figure(b, c, t))
            continue
        cmp.not_compared.append(NotCompared(name, why))
    return cmp


def apply_baseline(summary: dict[str, Any], baseline_dir: str | Path,
                   thresholds_path: str | Path | None = None) -> dict[str, Any]:
    """Qualify a run's summary against a baseline run; returns ``summary``.

    Adds ``summary["baseline"] = Comparison.to_dict()`` (plus ``"dir"``, the
    baseline directory) and ``summary["qualification"]``:

    - ``"pass"``: nothing regressed beyond its threshold;
    - ``"regressed"``: at least one regression (listed in
      ``summary["baseline"]["regressions"]``);
    - ``"unknown"``: the comparison could not be made (the baseline or the
      thresholds file is missing or bad); ``summary["baseline"]`` is then
      ``{"dir", "verdict": "unknown", "error": <message>}``.

    ``summary["verdict"]`` is left alone: it keeps meaning "the invariants
    of this run". Never raises (it runs in the run's finish, which must write
    the summary); check the options up front with ``load_thresholds`` and
    ``load_baseline``, which raise ``ConfigError``. Calling it again
    recomputes both keys.
    """
    try:
        t = load_thresholds(thresholds_path)
        base = load_baseline(baseline_dir)
        current = {k: v for k, v in summary.items() if k not in ("baseline", "qualification")}
        result = {"dir": str(baseline_dir), **compare(current, base, t).to_dict()}
    except ConfigError as e:
        result = {"dir": str(baseline_dir), "verdict": "unknown", "error": str(e)}
    except Exception as e:  # noqa: BLE001 - an odd summary shape: noted, never raised
        result = {"dir": str(baseline_dir), "verdict": "unknown",
                  "error": f"comparison failed: {type(e).__name__}: {e}"}
    summary["baseline"] = result
    summary["qualification"] = result["verdict"]
    return summary
