"""The export's input: the schedule's held faults (``Held``: an inject and
its heal), the schedule file, the options and the checks Kubernetes and
Chaos Mesh would make of them, and the labels every object carries."""

from __future__ import annotations

import hashlib
import inspect
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.schedule import Step, StepsError, steps_from_json
from ordeal.config import ConfigError

API_VERSION = "chaos-mesh.org/v1alpha1"
#: The Chaos Mesh release whose CRDs the output is checked against.
CHAOS_MESH_VERSION = "v2.8.3"
MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_ID = "ordeal/run-id"
STEP = "ordeal/step"
KIND = "ordeal/kind"
AT_S = "ordeal/at-s"
HOLD_S = "ordeal/hold-s"
SOURCE = "ordeal/source"
ENTRY = "ordeal-schedule"  # the Workflow's entry template
SUMMARY = "summary.txt"
SUMMARY_HEAD = "Ordeal Chaos Mesh export"
NODE_WORDS = ("one", "minority", "majority", "all")
KILL_ACTIONS = ("pod-kill", "container-kill")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?")


class ExportError(ConfigError):
    """A schedule file or option the export cannot use; the message names
    the file or option, what was wrong and what to do."""


class NotExported(Exception):
    """One fault with no Chaos Mesh equivalent (the reason is the message)."""


# ------------------------------------------------------------ the schedule

@dataclass(frozen=True)
class Held:
    """One fault of a schedule: an inject held until its paired heal."""

    n: int  # its place among the injects, in time order (f0, f1, ...)
    key: int
    kind: str
    target: str
    params: dict[str, Any]
    at_s: float
    hold_s: float

    @property
    def heal_s(self) -> float:
        return round(self.at_s + self.hold_s, 3)

    @property
    def label(self) -> str:
        return f"f{self.n}"


def held_faults(steps: Sequence[Step]) -> list[Held]:
    """Pair each inject with its heal (same key, the next heal after it),
    in the order of the inject times. Raises ExportError for a heal without
    an inject before it, a key injected twice before its heal, a heal before
    its inject's time, or an inject never healed."""
    open_: dict[int, Step] = {}
    pairs: list[tuple[Step, Step]] = []
    for i, s in enumerate(steps):
        if s.action == "inject":
            if s.key in open_:
                raise ExportError(f"steps[{i}]: key {s.key} injected again before its heal")
            open_[s.key] = s
        elif s.action == "heal":
            inj = open_.pop(s.key, None)
            if inj is None:
                raise ExportError(f"steps[{i}]: heal of key {s.key} without an earlier inject")
            if s.at_s < inj.at_s:
                raise ExportError(f"steps[{i}]: heal of key {s.key} at {s.at_s} s, before its "
                                  f"inject at {inj.at_s} s")
            pairs.append((inj, s))
        else:
            raise ExportError(f"steps[{i}]: action {s.action!r}; expected 'inject' or 'heal'")
    if open_:
        raise ExportError(f"inject(s) of key(s) {sorted(open_)} never healed; a schedule must "
                          "end healed")
    pairs.sort(key=lambda p: (p[0].at_s, p[0].key))
    return [Held(n, inj.key, inj.kind, inj.target, dict(inj.params), inj.at_s,
                 round(heal.at_s - inj.at_s, 3)) for n, (inj, heal) in enumerate(pairs)]


def read_schedule_file(path: Path) -> list[Step]:
    """The steps of a schedule file: what an exploration writes
    (``minimal-schedule.json``, docs/examples/*.json: format
    ``ordeal-schedule``) or an endurance run's ``endurance.json`` (format
    ``ordeal-endurance``). Every problem raises ExportError naming the
    file, the field and what to do."""
    path = Path(path)
    what = ("a schedule file is the JSON an exploration (minimal-schedule.json in its run "
            "directory, docs/examples/*.json) or an endurance run (endurance.json) writes")
    try:
        text = path.read_text()
    except OSError as e:
        raise ExportError(f"{path}: cannot read the schedule file ({e.strerror or e}); "
                          f"{what}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ExportError(f"{path}: not JSON ({e}); {what}") from None
    if not isinstance(doc, dict) or doc.get("format") not in ("ordeal-schedule",
                                                             "ordeal-endurance"):
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ExportError(f"{path}: not an Ordeal schedule (\"format\" is {got!r}; expected "
                          f"\"ordeal-schedule\" or \"ordeal-endurance\"); {what}")
    if doc.get("version") != 1:
        raise ExportError(f"{path}: version {doc.get('version')!r}; this Ordeal reads version 1")
    raw = doc.get("steps")
    if not isinstance(raw, list):
        raise ExportError(f"{path}: field 'steps' is {'missing' if raw is None else repr(raw)}; "
                          "expected a list of steps (at_s, action, kind, target, key, params)")
    try:
        steps = steps_from_json(raw, f"{path}: ", params_required=False)
    except StepsError as e:
        raise ExportError(str(e)) from None
    if not steps:
        raise ExportError(f"{path}: the schedule has no steps; nothing to export")
    try:
        held_faults(steps)
    except ExportError as e:
        raise ExportError(f"{path}: {e}") from None
    return steps


def constructor_defaults(registry: Mapping[str, type]) -> dict[str, dict[str, Any]]:
    """``{kind: {parameter: default}}`` from each kind's constructor: the
    values a schedule step gets for the parameters it leaves out."""
    out = {}
    for kind, cls in registry.items():
        params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
        out[kind] = {p.name: p.default for p in params if p.default is not p.empty}
    return out


def default_run_id(path: Path, text: bytes) -> str:
    """``<file stem>-<8 hex of the file's sha256>``: the same schedule file
    gives the same names (kubectl apply is then idempotent)."""
    stem = re.sub(r"[^a-z0-9]+", "-", Path(path).stem.lower()).strip("-")[:20].strip("-")
    return f"{stem or 'schedule'}-{hashlib.sha256(text).hexdigest()[:8]}"


# ------------------------------------------------------------- the options

@dataclass(frozen=True)
class Options:
    namespace: str = "default"
    selector: Mapping[str, str] = field(default_factory=dict)  # every replica pod
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # name -> labels
    replicas: int | None = None  # for minority / majority
    client_cidrs: tuple[str, ...] = ()  # where the load comes from (client-router)
    http_port: int = 8000
    router_http_port: int | None = None
    container: str | None = None
    kill: str = "pod-kill"
    run_id: str = "ordeal"
    source: str = ""  # the schedule file's name, for an annotation
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def check_options(o: Options) -> None:
    """Raise ExportError for options Kubernetes or Chaos Mesh would refuse."""
    if not _DNS_LABEL.fullmatch(o.namespace) or len(o.namespace) > 63:
        raise ExportError(f"--namespace {o.namespace!r}: not a Kubernetes namespace name "
                          "(lower-case letters, digits and '-', at most 63)")
    if not _RUN_ID.fullmatch(o.run_id):
        raise ExportError(f"--run-id {o.run_id!r}: use 1 to 30 lower-case letters, digits and "
                          "'-', starting and ending with a letter or digit (it goes into object "
                          "names and a label)")
    for where, labels in [("--selector", o.selector)] + [
            (f"--node {name}", labels) for name, labels in o.nodes.items()]:
        for k, v in labels.items():
            if why := label_problem(k, v):
                raise ExportError(f"{where}: label {k}={v}: {why}")
    for opt, port in (("--http-port", o.http_port), ("--router-http-port", o.router_http_port)):
        if port is not None and not 0 < port < 65536:
            raise ExportError(f"{opt} {port}: a TCP port is 1 to 65535")
    if o.replicas is not None and o.replicas < 1:
        raise ExportError(f"--replicas {o.replicas}: give the number of replicas (1 or more)")
    if o.kill not in KILL_ACTIONS:
        raise ExportError(f"--kill {o.kill!r}: use pod-kill or container-kill")
    if o.kill == "container-kill" and not o.container:
        raise ExportError("--kill container-kill needs --container NAME (Chaos Mesh kills a "
                          "named container)")
    if o.container is not None and not _DNS_LABEL.fullmatch(o.container):
        raise ExportError(f"--container {o.container!r}: not a container name")
    for c in o.client_cidrs:
        try:
            ipaddress.ip_network(c, strict=False)
        except ValueError:
            raise ExportError(f"--client-cidr {c!r}: give an address or a CIDR, e.g. "
                              "10.0.0.5/32") from None


def label_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` is not a Kubernetes label (None: it is one)."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(
            _DNS_LABEL.fullmatch(p) for p in prefix.split("."))):
        return f"the key's prefix {prefix!r} is not a DNS subdomain"
    if not _LABEL_NAME.fullmatch(name) or len(name) > 63:
        return ("the key's name must be 1 to 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit")
    if value and (not _LABEL_NAME.fullmatch(value) or len(value) > 63):
        return ("the value must be at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit")
    return None


# ---------------------------------------------------------- the documents

def num(x: float) -> str:
    """A number as short as it is exact to 1e-6: 10.0 -> '10', 0.5 -> '0.5'."""
    s = f"{float(x):.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def duration(seconds: float) -> str:
    """A Go duration to the millisecond: 10.0 -> '10s', 2.013 -> '2013ms',
    -3600 -> '-3600s'."""
    ms = round(seconds * 1000)
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    return f"{sign}{ms // 1000}s" if ms % 1000 == 0 else f"{sign}{ms}ms"
