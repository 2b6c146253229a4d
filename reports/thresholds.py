"""The thresholds a baseline comparison judges by (``--thresholds FILE``,
docs/runs.md): allowed change per latency percentile, seconds, memory and
rates, how many samples a tail figure needs, and which invariants may
change; read and checked whole, with the key and the fix for any mistake."""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ordeal.config import ConfigError

# ---------------------------------------------------------------- thresholds

PERCENTILES = ("mean", "min", "max", "p50", "p90", "p95", "p99", "p99.9")
PHASES = ("steady", "fault", "after_heal")


@dataclass(frozen=True)
class LatencyThresholds:
    relative: float = 0.20
    absolute_ms: float = 5.0
    percentiles: tuple[str, ...] = ("p50", "p90", "p99")
    phases: tuple[str, ...] = PHASES
    min_tail_samples: float = 5.0


@dataclass(frozen=True)
class SecondsThresholds:
    relative: float = 0.50
    absolute_s: float = 10.0


@dataclass(frozen=True)
class MemoryThresholds:
    relative: float = 0.20
    absolute_mb: float = 256.0


@dataclass(frozen=True)
class RateThresholds:
    error_rate: float = 0.01
    goodput: float = 0.01
    availability: float = 0.01


@dataclass(frozen=True)
class InvariantRules:
    unknown_is_regression: bool = True
    missing_is_regression: bool = True


@dataclass(frozen=True)
class Thresholds:
    """What counts as a regression. Defaults are documented in the module
    docstring and README; ``from_file`` reads the same keys from TOML."""

    latency: LatencyThresholds = field(default_factory=LatencyThresholds)
    seconds: SecondsThresholds = field(default_factory=SecondsThresholds)
    memory: MemoryThresholds = field(default_factory=MemoryThresholds)
    rates: RateThresholds = field(default_factory=RateThresholds)
    invariants: InvariantRules = field(default_factory=InvariantRules)
    ignore: tuple[str, ...] = ()

    @classmethod
    def from_file(cls, path: str | Path) -> Thresholds:
        """Read a thresholds TOML file; unknown tables or keys, wrong types
        and negative numbers are a ``ConfigError`` naming the file and key."""
        p = Path(path)
        where = f"--thresholds {p}"
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"{where}: no such file; give a TOML thresholds file "
                              "(see reports/baseline.py) or leave the option out "
                              "for the defaults") from e
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{where}: cannot read it as TOML ({e})") from e
        sections = {"latency": LatencyThresholds, "seconds": SecondsThresholds,
                    "memory": MemoryThresholds, "rates": RateThresholds,
                    "invariants": InvariantRules}
        known = sorted([*sections, "ignore"])
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {known}")
        out = cls()
        if "ignore" in data:
            out = replace(out, ignore=_strings(data["ignore"], f"{where}: ignore"))
        for name, kind in sections.items():
            if name not in data:
                continue
            table = data[name]
            if not isinstance(table, dict):
                raise ConfigError(f"{where}: {name} must be a table ([{name}])")
            out = replace(out, **{name: _section(kind, table, f"{where}: [{name}]")})
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        lat, sec, mem, r = self.latency, self.seconds, self.memory, self.rates
        return (f"latency worse by >{lat.relative:.0%} and >{lat.absolute_ms:g} ms; "
                f"seconds >{sec.relative:.0%} and >{sec.absolute_s:g} s; "
                f"memory >{mem.relative:.0%} and >{mem.absolute_mb:g} MB; "
                f"error_rate +{r.error_rate * 100:g} pp, goodput -{r.goodput * 100:g} pp, "
                f"availability -{r.availability * 100:g} pp")


def _strings(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: must be a list of strings, got {value!r}")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            raise ConfigError(f"{where}: unknown value(s) {bad}; allowed: {list(allowed)}")
    return tuple(value)


def _section(kind: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(kind)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        default = getattr(kind(), key)
        at = f"{where} {key}"
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{at}: must be true or false, got {value!r}")
            values[key] = value
        elif isinstance(default, tuple):
            allowed = PERCENTILES if key == "percentiles" else PHASES
            values[key] = _strings(value, at, allowed)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{at}: must be a number >= 0, got {value!r}")
            values[key] = float(value)
    return kind(**values)


def load_thresholds(path: str | Path | None) -> Thresholds:
    """The thresholds file, or the defaults when ``path`` is None."""
    return Thresholds() if path is None else Thresholds.from_file(path)
