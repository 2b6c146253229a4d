"""Known findings: what a stack is already known to do wrong, so a run can
say "known, tracked" instead of failing again on it, and still fail on
anything new (``--known-findings FILE``).

A file lists findings, each an invariant, optionally the fault kind and
target (shell patterns, ``fnmatch``) it happens under, its size (bounds),
why, and where it is tracked::

    [[finding]]
    invariant = "failover"
    fault = "process_pause"        # optional: the fault window's kind
    target = "replica-*"           # optional: the window's target
    max_ejection_s = 9.0           # its size: at least one bound (BOUNDS)
    reason = "vllm-router keeps sending to a paused replica for ~6 s"
    tracked = "https://... or a ticket id"

A known finding is an exception with a size: "ejects after about 6 s"
excuses 6 s, not 60. Every finding carries at least one bound, each on a
figure the invariant measures per fault window (``BOUNDS``; a bound of
another invariant, or an unknown key, is refused when the file is read,
the error naming the keys the invariant takes):

- ``failover``: ``max_ejection_s`` (required: the window's ``ejection_s``,
  from its start to the last request sent to the stopped replica) and
  ``max_late_sends`` (requests sent there after the failover bound). A
  replica not taken back after the heal is never covered.
- ``fault_slo``: ``max_last_missed_s`` (how far into the window the last
  judged request that missed its targets was sent) and
  ``min_window_goodput`` (the window's goodput floor).
- ``no_duplicate_execution``: ``max_duplicates`` (in one window).
- ``no_orphans``: ``max_orphans`` (after one kill) and ``max_orphan_s``
  (the oldest orphan's age when the heal found it).
- every other invariant: ``max_violations`` (in one window, as the
  invariant counts them).

``max_*`` is the most a covered window may measure, ``min_*`` the least.

Applied to a run's invariant results (``apply``): a failed invariant whose
every violation (``violations``) some finding covers (the invariant's name,
the kind and target of the fault window it happened in, and the window's
figures within every bound of the finding) is marked ``known`` with those
findings, each with its bounds and the worst figure it covered
(``measured``, keyed by bound), and the verdict does not count it; one
violation outside every finding keeps it failing, as a new finding. A
violation in a window a finding names but whose figure is beyond one of its
bounds is listed under ``beyond_known`` (on the invariant, and ``beyond``
in what ``apply`` returns) with the figure and the bound side by side. A
figure the invariant did not measure for the window (``None``, or absent
from ``details.measured_by_window``) is beyond every bound, never within.
A violation that names no fault window is covered only by a finding
without ``fault`` and ``target``.

A finding made in code (``KnownFinding``) without bounds covers any size;
a file cannot say that.

A listed finding that did not occur although a matching fault was injected
is reported in ``not_seen`` ("remove it when upstream fixed it"), not
failed: the findings this list is for depend on timing (an ejection of
5.9 s against a 5 s bound), and a run in which the router happened to be
quick is not a regression of Ordeal's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from ordeal.config import ConfigError, read_input
from ordeal.history.windows import label_parts

from .base import MAX_COUNTEREXAMPLES

_KEYS = {"invariant", "fault", "target", "reason", "tracked"}
#: The bounds a finding of an invariant may carry: key -> the per-window
#: figure it bounds (``details.measured_by_window[window][figure]``; the
#: figure ``violations`` is the window's count of violations). A ``max_``
#: key is the most a covered window may measure, a ``min_`` key the least.
BOUNDS: dict[str, dict[str, str]] = {
    "failover": {"max_ejection_s": "ejection_s", "max_late_sends": "sent_after_bound"},
    "fault_slo": {"max_last_missed_s": "last_missed_s", "min_window_goodput": "goodput"},
    "no_duplicate_execution": {"max_duplicates": "violations"},
    "no_orphans": {"max_orphans": "violations", "max_orphan_s": "oldest_orphan_s"},
}
#: The bound of every other invariant.
DEFAULT_BOUNDS = {"max_violations": "violations"}
#: Bounds a finding of the invariant must carry (besides at least one).
REQUIRED_BOUNDS = {"failover": ("max_ejection_s",)}
#: Per-window figures that, when true, no finding of the invariant covers
#: (a replica not taken back after the heal: a failover finding bounds the
#: ejection only).
NEVER_COVERED = {"failover": ("not_readmitted",)}
ALL_BOUND_KEYS = frozenset(k for b in (*BOUNDS.values(), DEFAULT_BOUNDS) for k in b)
#: The most windows beyond a finding's bounds itemised per invariant.
MAX_BEYOND = MAX_COUNTEREXAMPLES
#: Every invariant a finding may name: the checkers' and the engines' own.
INVARIANT_NAMES = frozenset({
    "no_silent_loss", "stream_wellformed", "usage_matches_tokens", "no_duplicate_execution",
    "replica_errors",
    "canary_determinism", "stream_continuity", "slo_latency", "goodput", "error_rate",
    "availability", "recovery", "restart_readiness", "failover", "fault_slo",
    "fault_effective", "no_orphans", "health_truthful",
    "counters_monotonic", "leak_bound", "sequence_consistent", "engine_consistency",
    "gpu_memory_back", "throttle_explained"})
#: Where the files for the embedded stacks this repository ships live, one
#: per engine and router version (``embedded_file``).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "suites" / "known_findings"


def bounds_of(invariant: str) -> dict[str, str]:
    """The bound keys a finding of ``invariant`` takes, and their figures."""
    return BOUNDS.get(invariant, DEFAULT_BOUNDS)


@dataclass(frozen=True)
class KnownFinding:
    invariant: str
    reason: str
    tracked: str
    fault: str | None = None
    target: str | None = None
    #: bound key -> its limit (BOUNDS); empty: any size (only in code)
    bounds: dict[str, float] = field(default_factory=dict, hash=False)

    def within(self, measured: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A window's figures against this finding's bounds: each bound's
        figure (keyed by bound), and the bounds it is beyond (a figure not
        measured is beyond every bound), then the never-covered figures
        that are true (``NEVER_COVERED``)."""
        figures = bounds_of(self.invariant)
        seen: dict[str, Any] = {}
        beyond: list[str] = []
        for key, limit in self.bounds.items():
            value = measured.get(figures.get(key, key))
            seen[key] = value
            if not isinstance(value, (int, float)) or isinstance(value, bool) or (
                    value < limit if key.startswith("min_") else value > limit):
                beyond.append(key)
        for figure in NEVER_COVERED.get(self.invariant, ()):
            if measured.get(figure):
                seen[figure] = measured[figure]
                beyond.append(figure)
        return seen, beyond

    def covers_window(self, label: str | None) -> bool:
        """A fault window ``kind@target#n`` (None: no window) is this finding's."""
        if label is None:
            return self.fault is None and self.target is None
        kind, target = label_parts(label)
        return ((self.fault is None or fnmatch.fnmatchcase(kind, self.fault))
                and (self.target is None or fnmatch.fnmatchcase(target, self.target)))

    def describe(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "fault": self.fault, "target": self.target,
                "bounds": dict(self.bounds), "reason": self.reason, "tracked": self.tracked}


@dataclass(frozen=True)
class KnownFindings:
    path: str
    sha256: str
    findings: tuple[KnownFinding, ...]
    chosen_by: str = "--known-findings"  # or why Ordeal chose the file

    def apply(self, invariants: list[dict[str, Any]],
              faults: list[dict[str, Any]]) -> dict[str, Any]:
        """Mark the known failures in ``invariants`` (result dicts, changed in
        place: ``known`` added, or ``beyond_known`` for the windows a finding
        names whose figures were beyond its bounds) and say what matched
        (with the worst figure covered beside each bound), what was beyond
        and what did not occur."""
        matched: dict[int, int] = {}
        worst: dict[int, dict[str, Any]] = {}  # finding -> bound key -> worst figure covered
        beyond_all: list[dict[str, Any]] = []
        for inv in invariants:
            if inv.get("valid") is not False:
                continue
            units = violations(inv)
            if not units:
                continue
            by_window = (inv.get("details") or {}).get("measured_by_window")
            by_window = by_window if isinstance(by_window, dict) else {}
            chosen: list[tuple[int, int, dict[str, Any]]] = []
            beyond: list[dict[str, Any]] = []
            new = 0
            for window, n in units:
                row = by_window.get(window) if window is not None else None
                figures = {**(row if isinstance(row, dict) else {}), "violations": n}
                hit, over = None, []
                for i, f in enumerate(self.findings):
                    if f.invariant != inv.get("name") or not f.covers_window(window):
                        continue
                    seen, out = f.within(figures)
                    if not out:
                        hit = (i, n, seen)
                        break
                    over.append({**f.describe(), "window": window, "violations": n,
                                 "measured": seen, "beyond": out})
                if hit is not None:
                    chosen.append(hit)
                    continue
                new += 1  # a violation no finding covers within its bounds: it fails
                beyond.extend(over[:MAX_BEYOND - len(beyond)])
            if beyond:
                inv["beyond_known"] = beyond
                beyond_all.extend(beyond)
            if new:
                continue
            here: dict[int, dict[str, Any]] = {}
            for i, n, seen in chosen:
                matched[i] = matched.get(i, 0) + n
                _worst(here.setdefault(i, {}), seen)
                _worst(worst.setdefault(i, {}), seen)
            inv["known"] = [{**self.findings[i].describe(), "measured": figures}
                            for i, figures in sorted(here.items())]
        windows = [f"{w.get('kind')}@{w.get('target')}#" for w in faults]
        not_seen = []
        for i, f in enumerate(self.findings):
            if i in matched:
                continue
            injected = any(f.covers_window(w) for w in windows) if (f.fault or f.target) \
                else False
            results = [inv for inv in invariants if inv["name"] == f.invariant]
            if not injected or not results:
                continue
            if all(r.get("valid") is True for r in results):
                why = ("a matching fault was injected and the invariant held: if upstream "
                       "fixed it, remove it from the file")
            elif all(r.get("valid") is True or (r.get("valid") is False and r.get("known"))
                     for r in results):
                why = ("a matching fault was injected and none of the invariant's violations "
                       "fell in its windows (other findings of the file covered them)")
            else:
                # Failed with violations no finding covers (judged a new finding), or
                # not judged: whether this finding occurred cannot be told.
                continue
            not_seen.append({**f.describe(), "why": why})
        return {"file": self.path, "sha256": self.sha256, "chosen_by": self.chosen_by,
                "findings": len(self.findings),
                "matched": [{**self.findings[i].describe(), "violations": n,
                             "measured": worst.get(i, {})} for i, n in sorted(matched.items())],
                "beyond": beyond_all, "not_seen": not_seen}


def _worst(into: dict[str, Any], seen: dict[str, Any]) -> None:
    """Keep in ``into`` the worst figure of each bound: the largest for a
    ``max_`` bound, the smallest for a ``min_`` one."""
    for key, value in seen.items():
        pick = min if key.startswith("min_") else max
        into[key] = value if key not in into else pick(into[key], value)


def violations(inv: dict[str, Any]) -> list[tuple[str | None, int]] | None:
    """A failed invariant's violations as (fault window, how many), or None
    when they cannot all be told. An invariant that counts them by window
    (``details.violations_by_window``, and ``violations`` in all) is read
    from those counts; another from its counterexamples, counted by window
    (a bound is per window), and only when the list is whole (shorter than
    the cap every checker cuts it at)."""
    details = inv.get("details") or {}
    by_window = details.get("violations_by_window")
    if isinstance(by_window, dict):
        total = details.get("violations")
        if not by_window or total != sum(by_window.values()):
            return None  # some happened in windows no longer itemised
        return list(by_window.items())
    examples = inv.get("counterexamples") or []
    if not examples or len(examples) >= MAX_COUNTEREXAMPLES:
        return None  # none to match, or the list may have been cut
    counts: dict[str | None, int] = {}
    for ex in examples:
        window = ex.get("window") if isinstance(ex, dict) else None
        window = window if isinstance(window, str) else None
        counts[window] = counts.get(window, 0) + 1
    return list(counts.items())


def embedded_file(fingerprints: Collection[str]) -> Path | None:
    """The shipped file for an embedded vLLM stack whose nodes have these
    fingerprints (``vllm-0.32.0-<digest>`` replicas, ``vllm-router-0.1.17``):
    ``suites/known_findings/vllm-0.32.0+vllm-router-0.1.17.toml``; None when
    there is none for these versions."""
    engines = sorted({f.rsplit("-", 1)[0] for f in fingerprints
                      if f.startswith("vllm-") and not f.startswith("vllm-router-")})
    routers = sorted({f for f in fingerprints if f.startswith("vllm-router-")})
    if len(engines) != 1 or len(routers) != 1:
        return None
    path = SHIPPED_DIR / f"{engines[0]}+{routers[0]}.toml"
    return path if path.is_file() else None


def read_known_findings(path: str | Path, invariants: Collection[str] = INVARIANT_NAMES,
                        chosen_by: str = "--known-findings") -> KnownFindings:
    """Read and check a findings file; ``invariants``: the names a finding
    may name (a misspelt one would never match and hide nothing)."""
    p = Path(path)
    where = f"known-findings file {p}"
    raw = read_input(p, where, "give a TOML file of [[finding]] tables (docs/invariants.md"
                               ", \"Known findings\"), or leave --known-findings out")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: not TOML ({e})") from e
    unknown = sorted(set(data) - {"finding"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {unknown}; only [[finding]]")
    findings = []
    for n, table in enumerate(data.get("finding", []), 1):
        at = f"{where}: finding {n}"
        if not isinstance(table, dict):
            raise ConfigError(f"{at}: write it as a [[finding]] table")
        bad = sorted(set(table) - _KEYS - ALL_BOUND_KEYS)
        if bad:
            raise ConfigError(f"{at}: unknown key(s) {bad}; known: {sorted(_KEYS)} and a "
                              f"bound of the invariant's ({_bound_help()})")
        for key in ("invariant", "reason", "tracked"):
            if not isinstance(table.get(key), str) or not table[key].strip():
                raise ConfigError(f"{at}: {key} is required (a non-empty string)")
        if table["invariant"] not in invariants:
            raise ConfigError(f"{at}: no invariant {table['invariant']!r}; known: "
                              f"{', '.join(sorted(invariants))}")
        for key in ("fault", "target"):
            if key in table and (not isinstance(table[key], str) or not table[key].strip()):
                raise ConfigError(f"{at}: {key} must be a non-empty pattern, or left out")
        findings.append(KnownFinding(table["invariant"], table["reason"], table["tracked"],
                                     table.get("fault"), table.get("target"),
                                     _read_bounds(table, at)))
    return KnownFindings(str(p), hashlib.sha256(raw).hexdigest()[:12], tuple(findings),
                         chosen_by)


def _bound_help() -> str:
    return "; ".join(f"{name}: {', '.join(keys)}" for name, keys in
                     [*BOUNDS.items(), ("any other", DEFAULT_BOUNDS)])


def _read_bounds(table: dict[str, Any], at: str) -> dict[str, float]:
    """A finding's bounds: at least one, each the invariant's (BOUNDS), a
    number >= 0 (a share for ``min_window_goodput``), the required ones there."""
    invariant = table["invariant"]
    takes = bounds_of(invariant)
    given = {k: v for k, v in table.items() if k in ALL_BOUND_KEYS}
    accepted = f"{invariant} takes {', '.join(takes)}"
    foreign = sorted(set(given) - set(takes))
    if foreign:
        raise ConfigError(f"{at}: {', '.join(foreign)} does not bound {invariant}; "
                          f"{accepted}")
    missing = [k for k in REQUIRED_BOUNDS.get(invariant, ()) if k not in given]
    if not given or missing:
        need = (f"{', '.join(missing)} is required" if missing
                else "at least one bound is required")
        raise ConfigError(f"{at}: {need}: a known finding is an exception with a size "
                          f"(the worst figure seen, plus a margin); {accepted}")
    for key, value in given.items():
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and value >= 0
              and (key != "min_window_goodput" or value <= 1))
        if not ok:
            want = ("a share from 0 to 1" if key == "min_window_goodput"
                    else "a finite number >= 0")
            raise ConfigError(f"{at}: {key} = {value!r} must be {want}")
    return {k: float(v) for k, v in given.items()}
