"""Fault schedules, pure and seeded: when to inject what, and when to heal.

A schedule alternates quiet and faulty periods (Jepsen's nemesis rhythm):
wait, inject one fault, hold it, heal it, wait again. Every inject has its
heal inside the schedule, so a schedule always ends healed; the executor
(``faults.nemesis.run_schedule``) also heals in ``finally``. The same seed
gives the same schedule, which is what makes a failing run replayable and
shrinkable (drop steps, replay, see if it still fails).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from ordeal.config import ConfigError


@dataclass(frozen=True)
class Step:
    at_s: float  # seconds after the schedule starts
    action: str  # "inject" or "heal"
    kind: str
    target: str  # a target spec (see faults.targets): "one", "replica-0", ...
    key: int  # pairs an inject with its heal
    params: dict[str, Any] = field(default_factory=dict)
    #: Wall seconds the plan left after this step for its action to take (a
    #: compressed plan leaves a restart's readiness wait): only an action
    #: slower than that pushes the rest of the schedule back, by the excess.
    allow_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.allow_s:  # most steps: files stay as they were
            del d["allow_s"]
        return d


@dataclass(frozen=True)
class FaultChoice:
    """One fault the schedule may pick: a kind, where, and with what."""

    kind: str
    target: str = "one"
    params: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0


def leave_out(choices: Sequence[FaultChoice],
              cannot: Mapping[str, str]) -> tuple[list[FaultChoice], dict[str, str]]:
    """The choices whose kind can run here, and ``{kind: why}`` of those left
    out (``cannot``: faults.catalogue.unrunnable_kinds). Pure."""
    kept = [c for c in choices if c.kind not in cannot]
    left = {c.kind: cannot[c.kind] for c in choices if c.kind in cannot}
    return kept, left


def plan_schedule(choices: Sequence[FaultChoice], duration_s: float, seed: int,
                  quiet_s: tuple[float, float] = (10.0, 20.0),
                  hold_s: tuple[float, float] = (5.0, 15.0),
                  tail_s: float = 10.0, cycle: bool = False) -> list[Step]:
    """Steps for ``duration_s`` seconds: quiet, inject, hold, heal, repeat.
    The last heal is at least ``tail_s`` before the end, so the run always
    sees the cluster after its final heal. Faults are drawn at random by
    weight, or with ``cycle`` taken in turn (so a short run sees each)."""
    if not choices:
        raise ConfigError("schedule: no fault to choose from; give at least one kind")
    for name, (lo, hi) in (("quiet_s", quiet_s), ("hold_s", hold_s)):
        if not 0 <= lo <= hi:
            raise ConfigError(f"schedule: {name}={lo, hi} must satisfy 0 <= min <= max")
    if quiet_s[0] + hold_s[0] < 0.1:
        raise ConfigError(f"schedule: quiet_s={quiet_s} and hold_s={hold_s} let a step take no "
                          "time; make min quiet + min hold at least 0.1 s")
    rng = random.Random(seed)
    steps: list[Step] = []
    t, key = 0.0, 0
    weights = [c.weight for c in choices]
    while True:
        start = t + rng.uniform(*quiet_s)
        hold = rng.uniform(*hold_s)
        # Judged on the times as written (ms): a heal at 1601.09674 s rounded
        # up past a bound of 1601.096736 s (Hypothesis found it).
        at_inject, at_heal = round(start, 3), round(start + hold, 3)
        if at_heal > duration_s - tail_s:
            break
        c = choices[key % len(choices)] if cycle else rng.choices(choices, weights)[0]
        steps.append(Step(at_inject, "inject", c.kind, c.target, key, dict(c.params)))
        steps.append(Step(at_heal, "heal", c.kind, c.target, key, dict(c.params)))
        key += 1
        t = start + hold
    return steps


def is_healed_at_end(steps: Sequence[Step]) -> bool:
    """Every inject has a later heal with the same key (a property the tests
    check over many seeds)."""
    open_keys: dict[int, float] = {}
    for s in sorted(steps, key=lambda s: (s.at_s, s.action != "heal")):
        if s.action == "inject":
            open_keys[s.key] = s.at_s
        elif s.action == "heal":
            if s.key not in open_keys or open_keys.pop(s.key) > s.at_s:
                return False
    return not open_keys


class StepsError(ConfigError):
    """A schedule file's steps that cannot be read; the message names the
    step and the field (the caller adds the file)."""


def need_field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...],
               where: str) -> Any:
    """``doc[key]`` if it is there and of ``kind`` (a bool is no number);
    ``StepsError`` naming ``where`` and the field otherwise."""
    if key not in doc:
        raise StepsError(f"{where}: missing field {key!r}")
    v = doc[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        name = "number" if kind == (int, float) else getattr(kind, "__name__", str(kind))
        raise StepsError(f"{where}: field {key!r} is {v!r}; expected {name}")
    return v


def steps_from_json(raw: list[Any], where: str, params_required: bool = True) -> list[Step]:
    """The steps of a schedule file (``Step.to_dict`` each), every field
    checked: the one reader of them (runs.explore's replay, faults.chaos_mesh's
    export). Pairing inject with heal is the caller's."""
    steps = []
    for i, s in enumerate(raw):
        at_where = f"{where}steps[{i}]"
        if not isinstance(s, dict):
            raise StepsError(f"{at_where}: expected an object, got {s!r}")
        at = need_field(s, "at_s", (int, float), at_where)
        action = need_field(s, "action", str, at_where)
        if action not in ("inject", "heal") or at < 0:
            raise StepsError(f"{at_where}: action {action!r} at {at} s; expected 'inject' or "
                             "'heal' at a time >= 0")
        params = (need_field(s, "params", dict, at_where) if params_required or "params" in s
                  else {})
        allow = need_field(s, "allow_s", (int, float), at_where) if "allow_s" in s else 0.0
        if allow < 0:
            raise StepsError(f"{at_where}: allow_s {allow}; expected seconds >= 0")
        steps.append(Step(float(at), action, need_field(s, "kind", str, at_where),
                          need_field(s, "target", str, at_where),
                          need_field(s, "key", int, at_where), dict(params), float(allow)))
    return steps
