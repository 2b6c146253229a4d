"""What checkers are told besides the ops: SLO targets and the thresholds of
the checkers that judge by a bound. One typed, frozen home for every setting
and its default, so a misspelt name is an error where it is written, not a
default silently used where it is read.

Producers build them with keyword arguments or ``dataclasses.replace``: the
pytest plugin from ``--slo FILE``, ``--determinism-prefix-tokens`` and
``--warmup-s``, the GPU scenario with its own targets and warm-up,
exploration with its shorter stall bound, a schedule file with the settings
it was found under (``overrides``/``from_overrides``).
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from ordeal.config import ConfigError

_T = TypeVar("_T")


@dataclass(frozen=True)
class SLOTargets:
    """Targets, with defaults sized for the tiny CPU model on a 2-core
    machine; real clusters should set their own (``--slo FILE``)."""

    ttft_ms: float = 2000.0  # per request, as vllm bench serve's --goodput ttft:
    tpot_ms: float = 200.0
    e2e_ms: float = 10000.0
    percentile: float = 99.0  # steady-state latency is judged at this percentile
    min_goodput: float = 0.95  # steady-state share of requests meeting every SLO
    max_error_rate: float = 0.01  # steady-state share of fail + info
    min_availability: float = 0.5  # share ok inside each fault window
    after_heal_s: float = 30.0  # length of the after-heal window
    recovery_bound_s: float = 30.0  # the SLO must hold again this soon after a heal
    restart_bound_s: float = 240.0  # a killed node must serve again this soon
    # failover: a replica that stopped answering gets no new request after
    # this long (a router that checks health every second and ejects after a
    # few failed checks needs a few seconds), and is taken back this soon
    # after its heal (invariants.failover)
    failover_bound_s: float = 5.0
    readmission_bound_s: float = 30.0

    @classmethod
    def from_file(cls, path: str | Path) -> "SLOTargets":
        """Read ``[slo]`` from a TOML file (a file of bare keys is read as
        ``[slo]``); unknown keys are an error."""
        p = Path(path)
        data = _read_slo_file(p)
        if any(k in data for k in SLO_TABLES):
            unknown = sorted(set(data) - set(SLO_TABLES))
            if unknown:
                raise ConfigError(f"--slo {p}: unknown table(s) or key(s) {unknown} beside "
                                  f"{'/'.join(f'[{t}]' for t in SLO_TABLES)}")
            return cls.from_table(data.get("slo", {}), f"--slo {p} [slo]")
        return cls.from_table(data, f"--slo {p}")

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str) -> "SLOTargets":
        return _targets_from_table(cls, table, where)


def _targets_from_table(cls: type[_T], table: dict[str, Any], where: str) -> _T:
    """Targets (a dataclass of numbers) from a plain mapping; an unknown key
    or a value that is not a number raises ConfigError naming ``where``."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    try:
        return replace(cls(), **{k: float(v) for k, v in table.items()})  # type: ignore[type-var]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: every value must be a number ({e})") from e


def _read_slo_file(p: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--slo {p}: cannot read it as TOML ({e})") from e


@dataclass(frozen=True)
class FaultSLOTargets:
    """Targets inside a fault window on one replica that stopped answering,
    for the requests sent after ``failover_bound_s`` (invariants.fault_slo):
    by then a router with working health checks sends everything to the
    replicas left, which carry the load of the lost one too. So the defaults
    are the steady targets' double, and a lower goodput."""

    ttft_ms: float = 4000.0
    tpot_ms: float = 400.0
    e2e_ms: float = 20000.0
    min_goodput: float = 0.9  # share of the window's judged requests meeting every target
    min_requests: float = 5.0  # a window with fewer judged requests is shown, not judged

    @classmethod
    def from_file(cls, path: str | Path) -> "FaultSLOTargets":
        """Read ``[fault_slo]`` from the SLO file (defaults without one)."""
        p = Path(path)
        table = _read_slo_file(p).get("fault_slo", {})
        if not isinstance(table, dict):
            raise ConfigError(f"--slo {p}: fault_slo must be a table ([fault_slo])")
        return cls.from_table(table, f"--slo {p} [fault_slo]")

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str) -> "FaultSLOTargets":
        return _targets_from_table(cls, table, where)


#: The tables an SLO file may hold.
SLO_TABLES = ("slo", "fault_slo", "drift", "harness")

#: ``[drift]`` and ``[harness]`` keys of the SLO file -> CheckerSettings fields.
FILE_SETTINGS = {
    "drift": {"rss_mb_per_h": "drift_rss_mb_per_h", "fds_per_h": "drift_fds_per_h",
              "threads_per_h": "drift_threads_per_h",
              "kv_cache_idle_per_h": "drift_kv_cache_idle_per_h",
              "recovery_s_per_h": "drift_recovery_s_per_h", "settle_s": "drift_settle_s",
              "min_span_h": "drift_min_span_h"},
    "harness": {"max_schedule_lag_ms": "max_schedule_lag_ms"},
}


def settings_from_file(path: str | Path) -> dict[str, float]:
    """The SLO file's ``[drift]`` and ``[harness]`` tables as CheckerSettings
    keyword arguments (none without them); an unknown key or a value that is
    not a non-negative number raises ConfigError naming it."""
    p = Path(path)
    data = _read_slo_file(p)
    out: dict[str, float] = {}
    for table, keys in FILE_SETTINGS.items():
        given = data.get(table, {})
        if not isinstance(given, dict):
            raise ConfigError(f"--slo {p}: {table} must be a table ([{table}])")
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ConfigError(f"--slo {p} [{table}]: unknown key(s) {unknown}; known: "
                              f"{sorted(keys)}")
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"--slo {p} [{table}]: {key} = {value!r}; give a number >= 0")
            out[keys[key]] = float(value)
    return out


@dataclass(frozen=True)
class CheckerSettings:
    """Every checker setting, each with the default a run gets unless a
    producer says otherwise."""

    #: Latency, goodput, error-rate, availability and recovery targets
    #: (invariants.slo, throttle_explained); ``--slo FILE`` sets them.
    slo: SLOTargets = field(default_factory=SLOTargets)
    #: fault_slo's targets inside the fault windows on one replica; ``[fault_slo]``
    #: in the same ``--slo FILE``.
    fault_slo: FaultSLOTargets = field(default_factory=FaultSLOTargets)
    #: canary_determinism compares the first K token ids; 0 compares the whole
    #: text, since greedy output of the tiny CPU model measured identical under load.
    determinism_prefix_tokens: int = 0
    #: no_duplicate_execution forgets an id this long after first seeing it: a
    #: retry comes within the request timeout (seconds), and memory stays bounded.
    duplicate_window_s: float = 900.0
    #: no_orphans: a process of a node whose main process ended, with no
    #: process_kill announced, may run on this long (the default bound of
    #: process_kill's own orphan check).
    orphan_bound_s: float = 10.0
    #: health_truthful calls a 200 with queued work a lie once the token counter
    #: has not moved this long: several monitor samples, while a working
    #: replica moves it many times a second.
    health_stall_s: float = 10.0
    #: leak_bound: a node's RSS after the drain may be up to this times its
    #: baseline; a leak grows with the run, the growth of warming up does not ...
    leak_rss_factor: float = 1.5
    #: ... plus this much, so a small process is not judged on a few pages.
    leak_rss_slack_mb: float = 256.0
    #: leak_bound: RSS growth allowed over the second half of a node's samples
    #: (middle to drain), when that half is at most leak_half_max_s long; clean
    #: runs here grew at most 68 MB, a planted 4 MiB/request leak 358 MB.
    leak_half_growth_mb: float = 256.0
    leak_half_max_s: float = 3600.0
    #: gpu_memory_back: drained GPU memory may exceed the baseline by this much
    #: (allocator caches); a co-tenant or a kept allocation is gigabytes.
    gpu_mem_slack_mb: float = 1024.0
    #: throttle_explained: a slowdown reading this long before or after a
    #: breaching request still explains it (readings come about once a second).
    throttle_slack_s: float = 1.0
    #: Seconds after the load's first request that are phase "warmup", not
    #: "steady" (invariants.requests): a fresh engine is slower at first, and the
    #: steady baseline that faults are compared with must not hold that.
    warmup_s: float = 0.0
    #: schedule_lag: the open loop's p99 lag (sent minus due) above this makes
    #: the run harness-bound ("unknown"): the load offered was not the load planned.
    max_schedule_lag_ms: float = 1000.0
    #: drift (invariants.drift, endurance runs): the growth per hour of wall
    #: time a series may show (its slope's lower 95% bound must stay below).
    #: A replica growing 30 MB an hour is a finding; 10 MB is 720 MB in 72 h.
    drift_rss_mb_per_h: float = 10.0
    drift_fds_per_h: float = 2.0  # 144 more descriptors in 72 h
    drift_threads_per_h: float = 1.0
    drift_kv_cache_idle_per_h: float = 0.005  # share of the KV cache held while idle
    drift_recovery_s_per_h: float = 2.0  # a fault kind's recovery time
    #: Seconds after each (re)start of a node left out of its series (warm-up).
    drift_settle_s: float = 600.0
    #: A series covering less than this many hours is shown, not judged.
    drift_min_span_h: float = 1.0
    #: fault_effective: fault kinds whose windows count without evidence of
    #: their effect (the target file's ``trusted_without_evidence``: a hook or
    #: a Toxiproxy link Ordeal cannot observe). Listed, never silent; any
    #: other window without evidence makes fault_effective "unknown".
    trusted_without_evidence: tuple[str, ...] = ()

    def drift_bounds(self) -> dict[str, float]:
        """Series name (invariants.drift) -> its bound per hour."""
        return {"rss_mb": self.drift_rss_mb_per_h, "fds": self.drift_fds_per_h,
                "threads": self.drift_threads_per_h,
                "kv_cache_idle": self.drift_kv_cache_idle_per_h,
                "recovery_s": self.drift_recovery_s_per_h}

    def overrides(self) -> dict[str, Any]:
        """The settings that differ from the defaults, as plain JSON values
        (what a schedule file keeps)."""
        default = CheckerSettings()
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out[f.name] = (asdict(value) if isinstance(value, (SLOTargets, FaultSLOTargets))
                               else list(value) if isinstance(value, tuple) else value)
        return out

    @classmethod
    def from_overrides(cls, doc: dict[str, Any], where: str) -> "CheckerSettings":
        """The defaults with ``doc`` (``overrides()``'s form) applied; an
        unknown name or a value of the wrong type raises ConfigError naming
        ``where``."""
        default = cls()
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {unknown}; known: {known}")
        kw: dict[str, Any] = {}
        for name, value in doc.items():
            want = getattr(default, name)
            if isinstance(want, (SLOTargets, FaultSLOTargets)):
                if not isinstance(value, dict):
                    raise ConfigError(f"{where}: {name} is {value!r}; expected an object")
                kw[name] = type(want).from_table(value, f"{where}: {name}")
            elif isinstance(want, tuple):
                if not isinstance(value, (list, tuple)) or not all(
                        isinstance(v, str) for v in value):
                    raise ConfigError(f"{where}: {name} is {value!r}; expected a list of "
                                      "strings")
                kw[name] = tuple(value)
            elif (isinstance(value, bool) or not isinstance(value, (int, float))
                  or isinstance(want, int) and not isinstance(value, int)):
                raise ConfigError(f"{where}: {name} is {value!r}; expected "
                                  f"{type(want).__name__}")
            else:
                kw[name] = type(want)(value)
        return replace(default, **kw)
