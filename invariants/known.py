"""Known findings: what a stack is already known to do wrong, so a run can
say "known, tracked" instead of failing again on it, and still fail on
anything new (``--known-findings FILE``).

A file lists findings, each an invariant, optionally the fault kind and
target (shell patterns, ``fnmatch``) it happens under, why, and where it is
tracked::

    [[finding]]
    invariant = "failover"
    fault = "process_pause"        # optional: the fault window's kind
    target = "replica-*"           # optional: the window's target
    reason = "vllm-router keeps sending to a paused replica for ~6 s"
    tracked = "https://... or a ticket id"

Applied to a run's invariant results (``apply``): a failed invariant whose
every violation (``violations``) some finding covers (the invariant's name,
and the kind and target of the fault window it happened in) is marked
``known`` with those findings, and the verdict does not count it; one
violation outside every finding keeps it failing, as a new finding. A
violation that names no fault window is covered only by a finding without
``fault`` and ``target``.

A listed finding that did not occur although a matching fault was injected
is reported in ``not_seen`` ("remove it when upstream fixed it"), not
failed: the findings this list is for depend on timing (an ejection of
5.9 s against a 5 s bound), and a run in which the router happened to be
quick is not a regression of Ordeal's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

from ordeal.config import ConfigError, read_input

from .base import MAX_COUNTEREXAMPLES

_KEYS = {"invariant", "fault", "target", "reason", "tracked"}
#: Every invariant a finding may name: the checkers' and the engines' own.
INVARIANT_NAMES = frozenset({
    "no_silent_loss", "stream_wellformed", "usage_matches_tokens", "no_duplicate_execution",
    "canary_determinism", "stream_continuity", "slo_latency", "goodput", "error_rate",
    "availability", "recovery", "restart_readiness", "failover", "fault_slo",
    "fault_effective", "no_orphans", "health_truthful",
    "counters_monotonic", "leak_bound", "sequence_consistent", "engine_consistency",
    "gpu_memory_back", "throttle_explained"})
#: Where the files for the embedded stacks this repository ships live, one
#: per engine and router version (``embedded_file``).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "suites" / "known_findings"


@dataclass(frozen=True)
class KnownFinding:
    invariant: str
    reason: str
    tracked: str
    fault: str | None = None
    target: str | None = None

    def covers_window(self, label: str | None) -> bool:
        """A fault window ``kind@target#n`` (None: no window) is this finding's."""
        if label is None:
            return self.fault is None and self.target is None
        kind, _, rest = label.partition("@")
        target = rest.rsplit("#", 1)[0]
        return ((self.fault is None or fnmatch.fnmatchcase(kind, self.fault))
                and (self.target is None or fnmatch.fnmatchcase(target, self.target)))

    def describe(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "fault": self.fault, "target": self.target,
                "reason": self.reason, "tracked": self.tracked}


@dataclass(frozen=True)
class KnownFindings:
    path: str
    sha256: str
    findings: tuple[KnownFinding, ...]
    chosen_by: str = "--known-findings"  # or why Ordeal chose the file

    def apply(self, invariants: list[dict[str, Any]],
              faults: list[dict[str, Any]]) -> dict[str, Any]:
        """Mark the known failures in ``invariants`` (result dicts, changed in
        place: ``known`` added) and say what matched and what did not occur."""
        matched: dict[int, int] = {}
        for inv in invariants:
            if inv.get("valid") is not False:
                continue
            units = violations(inv)
            if not units:
                continue
            chosen: list[tuple[int, int]] = []
            for window, n in units:
                i = next((i for i, f in enumerate(self.findings)
                          if f.invariant == inv.get("name") and f.covers_window(window)), None)
                if i is None:
                    break  # a violation no finding covers: a new finding, it fails
                chosen.append((i, n))
            else:
                inv["known"] = [self.findings[i].describe() for i in sorted({i for i, _ in chosen})]
                for i, n in chosen:
                    matched[i] = matched.get(i, 0) + n
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
                "matched": [{**self.findings[i].describe(), "violations": n}
                            for i, n in sorted(matched.items())],
                "not_seen": not_seen}


def violations(inv: dict[str, Any]) -> list[tuple[str | None, int]] | None:
    """A failed invariant's violations as (fault window, how many), or None
    when they cannot all be told. An invariant that counts them by window
    (``details.violations_by_window``, and ``violations`` in all) is read
    from those counts; another from its counterexamples, and only when the
    list is whole (shorter than the cap every checker cuts it at)."""
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
    return [(ex.get("window") if isinstance(ex, dict) else None, 1) for ex in examples]


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
    raw = read_input(p, where, "give a TOML file of [[finding]] tables (README: Known "
                               "findings), or leave --known-findings out")
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
        bad = sorted(set(table) - _KEYS)
        if bad:
            raise ConfigError(f"{at}: unknown key(s) {bad}; known: {sorted(_KEYS)}")
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
                                     table.get("fault"), table.get("target")))
    return KnownFindings(str(p), hashlib.sha256(raw).hexdigest()[:12], tuple(findings),
                         chosen_by)
