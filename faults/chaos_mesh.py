"""Chaos Mesh manifests for an Ordeal schedule (``python -m faults export --chaos-mesh``).

For a team that runs Chaos Mesh on its Kubernetes cluster: the same faults
at the same times as an Ordeal schedule, written as Chaos Mesh objects
(``apiVersion: chaos-mesh.org/v1alpha1``), checked against the CRDs of Chaos
Mesh v2.8.3 (``tests/data/chaos_mesh_crds_v2.8.3.json``). Nothing here talks
to a cluster: the functions are pure (schedule and options in, dicts out)
but for reading the schedule file and writing the output directory.

What is written (``write_export``)::

    OUT/workflow.yaml          one Workflow: the whole schedule, timed
    OUT/steps/f00-....yaml     one object per fault and target, with its
                               ``duration``: to apply one fault by hand
    OUT/summary.txt            what was exported, what was not and why

One document per file. Without PyYAML (not a dependency of Ordeal) the YAML
is written by ``to_yaml``: block style, every string that YAML could read as
anything else double-quoted. ``--format json`` writes JSON instead (JSON is
YAML too; kubectl takes both).

Sequencing: a Workflow, not a Schedule. Chaos Mesh's ``Schedule`` repeats
ONE chaos on a cron line (``spec.schedule``, ``concurrencyPolicy``); it has
no one-off sequence of different faults at given offsets. A ``Workflow`` runs
once, and its templates say exactly that: ``Suspend`` (wait its
``deadline``), ``Serial`` and ``Parallel`` (children in turn, or together),
and a chaos template whose ``deadline`` is how long the fault is held (in a
Workflow an embedded chaos must NOT have a ``duration``: the webhook rejects
it, api/v1alpha1/workflow_webhook.go). An inject and its paired heal (same
key) become one chaos template held from the inject to the heal:

- faults that never overlap (every schedule ``plan_schedule`` draws): the
  entry is a ``Serial`` of ``Suspend`` (the quiet gap) and chaos templates;
- faults that overlap (a hand-written or explored schedule may): the entry
  is a ``Parallel`` of one ``Serial`` per fault (``Suspend`` until its inject
  time, then the fault), so each starts at its own offset.

A fault that is not exported leaves its time as quiet time: the others keep
their offsets. Chaos Mesh starts each node when the one before it ends, so
in the Serial form the controller's latency (a second or so per step,
unmeasured here) accumulates; the standalone objects in ``steps/`` carry
their offset (annotation ``ordeal/at-s``) for applying by hand instead.

Targets. The schedule names nodes as Ordeal's clusters do; a manifest needs
label selectors (always in ``--namespace``):

- ``one`` / ``all``: the replica pods (``--selector KEY=VALUE``, every
  replica pod has those labels and no other pod does), ``mode: one|all``;
- ``minority`` / ``majority``: ``mode: fixed`` with the count Ordeal would
  take (faults.targets.select), which needs ``--replicas N``;
- a node name (``replica-0``, ``router``, or a comma list): the pods of
  ``--node NAME=KEY=VALUE[,KEY=VALUE]`` (used as written, not merged with
  ``--selector``), ``mode: all``; a list gives one object per name, run
  together (a ``Parallel`` template);
- a link (``router-replica-0``, ``client-router``): the router's pods
  (``--node router=...``) and the replica's. ``network_latency`` and
  ``bandwidth_limit`` on ``router-X`` act on the router pods with ``target``
  the pods of X and ``direction`` upstream -> ``to`` (router to X),
  downstream -> ``from`` (X to router), both -> ``both``; on
  ``client-router`` the load generator is outside the cluster, so only
  downstream exports: the router's packets to ``--client-cidr`` (Chaos Mesh
  takes external targets with direction ``to`` only). HTTP faults act on
  the server end of the link (X, or the router for client-router) on
  ``--http-port`` (``--router-http-port`` for the router). A link word
  (``one``, ``all``) is a choice Ordeal makes among its fault proxy's links
  when the run starts: not exported.

The kinds (checked against api/v1alpha1/*_types.go and the webhooks of
Chaos Mesh v2.8.3):

====================  =======================================================
network_partition     NetworkChaos ``partition``, direction both, no target:
                      every packet in and out of the pod is dropped (mode
                      drop; mode reject, a TCP reset, has no equivalent)
packet_loss           NetworkChaos ``loss`` (percent) on the pod's egress
network_latency       NetworkChaos ``delay`` (latency, jitter) on the link
bandwidth_limit       NetworkChaos ``bandwidth`` (tbf: rate, limit, buffer)
connection_reset      HTTPChaos ``abort`` (only at the first bytes:
                      ``timeout_ms=0``, ``after_bytes=0``)
http_fault            HTTPChaos: abort -> replace code, body and
                      content type of the response; delay_head -> delay;
                      error_event, truncate, malformed: none
clock_drift           TimeChaos ``timeOffset`` on CLOCK_REALTIME (mode
                      offset; drift and strobe have none)
process_kill          PodChaos ``pod-kill`` (or ``container-kill``, see
                      ``--kill``); scope node and restart=true only
gpu_memory_pressure   StressChaos memory stressor, only for backend='cpu'
                      (host RAM); Chaos Mesh has no GPU memory stressor
process_pause         none: PodChaos has pod-kill, pod-failure and
                      container-kill, no SIGSTOP
gpu_throttle          none: no GPU stressor, no CPU quota
lsn_jump              none: no action on single events of a stream
ray_node_*            none: Ray-only kinds
====================  =======================================================

Any parameter a mapping does not know, and a ``toxicity`` below 1 (Chaos
Mesh acts on every packet or request of the pods it selects), leaves the
fault out with the reason; Ordeal's own waits (``ready_timeout_s``,
``gone_within_s``, ``orphan_bound_s``) are ignored. Each mapping's
approximation is written beside it (``NOTES``) and in summary.txt. Why a
kind has no equivalent is declared by the kind (``KindTraits.chaos_mesh_none``).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import ipaddress
import json
import math
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ordeal import kinds as kind_traits
from ordeal.config import ConfigError

from .http_fault import MODES as HTTP_MODES
from .schedule import Step, StepsError, steps_from_json

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
#: tbf's queue limit and burst (BandwidthSpec requires both, >= 1): the
#: values of Chaos Mesh's own bandwidth example.
BANDWIDTH_LIMIT = 20_971_520
BANDWIDTH_BUFFER = 10_000
NODE_WORDS = ("one", "minority", "majority", "all")
KILL_ACTIONS = ("pod-kill", "container-kill")
#: A Workflow template's field for each embedded chaos (EmbedChaos).
EMBED = {"NetworkChaos": "networkChaos", "PodChaos": "podChaos", "TimeChaos": "timeChaos",
         "StressChaos": "stressChaos", "HTTPChaos": "httpChaos"}
#: Ordeal link direction -> NetworkChaos direction, with the router's pods
#: selected and the server's pods as ``target`` (upstream = router to server).
NET_DIRECTION = {"upstream": "to", "downstream": "from", "both": "both"}
#: Ordeal link direction -> the HTTPChaos target of a reset at the first
#: bytes (``both``: the first bytes of a connection go upstream).
HTTP_TARGET = {"upstream": "Request", "downstream": "Response", "both": "Request"}

def no_equivalent(kind: str) -> str | None:
    """Why ``kind`` has no Chaos Mesh equivalent (what the kind declares,
    ``KindTraits.chaos_mesh_none``, or that this module maps no such
    kind), or None where ``MAPPERS`` maps it."""
    traits = kind_traits.of(kind)
    if traits is not None and traits.chaos_mesh_none:
        return traits.chaos_mesh_none
    if kind in MAPPERS:
        return None
    if traits is not None:
        return (f"faults/chaos_mesh.py has no mapping for {kind} (a mapping is added to its "
                "MAPPERS, with what it changes in NOTES)")
    return f"unknown fault kind {kind!r}"


#: What each exported kind's mapping changes, against Ordeal's own fault.
NOTES: dict[str, str] = {
    "network_partition": (
        "partition drops every packet in and out of the pod (kubelet probes and DNS too: a "
        "liveness probe failing for the hold restarts the container), where Ordeal drops only "
        "TCP to and from the node's serving port"),
    "packet_loss": (
        "loss drops the packets the pod sends (netem on its egress), where Ordeal drops packets "
        "of the node's port both ways: a round trip meets the loss once instead of twice"),
    "network_latency": (
        "netem delays every packet the chosen side sends to the other, where Ordeal's proxy "
        "delays every chunk of data on the link: the same added latency per round trip"),
    "bandwidth_limit": (
        f"tbf limits what the chosen side sends to the other (tc's 'kbps' is 1000 bytes/s, "
        f"as rate_kbps); queue limit {BANDWIDTH_LIMIT} B and burst {BANDWIDTH_BUFFER} B are "
        "Chaos Mesh's example values"),
    "connection_reset": (
        "HTTPChaos's proxy in the server pod closes the connection without an answer (Ordeal "
        "sends a TCP reset); plain HTTP only, and a connection opened before the fault is not "
        "affected, so a router's pooled connections may escape it"),
    "http_fault": (
        "HTTPChaos acts in the server pod on plain HTTP, and a connection opened before the "
        "fault is not affected (pooled connections may escape it); abort: the server still "
        "serves the request and its answer is replaced (Ordeal answers in its place, the "
        "engine never sees it); every request on the port is hit, /health and /metrics too"),
    "clock_drift": (
        "TimeChaos shifts CLOCK_REALTIME of the container's PID 1 and its children (vDSO "
        "injection); the monotonic clock stays, as with Ordeal's libfaketime"),
    "process_kill": (
        "one-shot: Kubernetes brings the pod back at once (pod-kill: its controller makes a "
        "new pod; container-kill: the kubelet restarts the container in place), where Ordeal "
        "keeps the node down until the heal; the workflow still waits the hold"),
    "gpu_memory_pressure": (
        "the memory stressor runs inside the pod's container (its cgroup): the memory counts "
        "against the pod's limit and can get it OOM-killed, where Ordeal's hog runs beside "
        "the node"),
}
#: Parameters that are Ordeal's own waits, not part of the fault.
HARNESS_ONLY = {"process_kill": ("ready_timeout_s", "gone_within_s", "orphan_bound_s")}

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


# ------------------------------------------------------------ the mapping

@dataclass(frozen=True)
class Chaos:
    """One Chaos Mesh object's kind and spec (no ``duration``: the workflow
    template gets a deadline, the standalone object a duration)."""

    crd: str  # NetworkChaos, PodChaos, ...
    spec: dict[str, Any]
    target: str  # what it acts on, as the schedule names it

    @property
    def one_shot(self) -> bool:
        """pod-kill and container-kill act once; their duration means nothing."""
        return self.crd == "PodChaos" and self.spec.get("action") in KILL_ACTIONS


@dataclass(frozen=True)
class Exported:
    held: Held
    chaos: tuple[Chaos, ...]


@dataclass(frozen=True)
class LeftOut:
    held: Held
    reason: str


def _pod_selector(o: Options, labels: Mapping[str, str], mode: str,
                  value: str | None = None) -> dict[str, Any]:
    sel: dict[str, Any] = {"selector": {"namespaces": [o.namespace],
                                        "labelSelectors": dict(labels)}, "mode": mode}
    if value is not None:
        sel["value"] = value
    return sel


def _node(name: str, o: Options) -> dict[str, Any]:
    if name not in o.nodes:
        raise NotExported(f"no selector for {name!r}: give --node {name}=KEY=VALUE[,KEY=VALUE] "
                          "(the labels of its pods)")
    return _pod_selector(o, o.nodes[name], "all")


def _names(target: str) -> list[str]:
    return [x.strip() for x in target.split(",") if x.strip()]


def pods_for(target: str, o: Options) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, PodSelector)]`` for a node target (see the module's doc)."""
    if target in NODE_WORDS:
        if not o.selector:
            raise NotExported(f"target {target!r} chooses among the replicas: give --selector "
                              "KEY=VALUE (labels every replica pod has and no other pod has)")
        if target in ("one", "all"):
            return [(target, _pod_selector(o, o.selector, target))]
        if o.replicas is None:
            raise NotExported(f"target {target!r} is a share of the replicas: give --replicas N "
                              "(how many replica pods --selector matches)")
        n = o.replicas
        k = max(1, (n - 1) // 2) if target == "minority" else n // 2 + 1
        return [(target, _pod_selector(o, o.selector, "fixed", str(k)))]
    names = _names(target)
    if not names:
        raise NotExported(f"target {target!r} names no node")
    return [(x, _node(x, o)) for x in names]


@dataclass(frozen=True)
class LinkEnds:
    name: str
    client: str | None  # "router", or None: the load generator outside the cluster
    server: str


def links_for(target: str, o: Options) -> list[LinkEnds]:
    if target in NODE_WORDS:
        raise NotExported(f"target {target!r} picks among the fault proxy's links when a run "
                          "starts, which a manifest cannot; name the link in the schedule "
                          "(client-router, router-replica-0)")
    out = []
    for name in _names(target):
        if name == "client-router":
            out.append(LinkEnds(name, None, "router"))
        elif name.startswith("router-") and len(name) > len("router-"):
            out.append(LinkEnds(name, "router", name[len("router-"):]))
        else:
            raise NotExported(f"{name!r} is not a link (client-router, router-<node>)")
    if not out:
        raise NotExported(f"target {target!r} names no link")
    return out


def _params(h: Held, o: Options, known: Sequence[str]) -> dict[str, Any]:
    extra = sorted(set(h.params) - set(known) - set(HARNESS_ONLY.get(h.kind, ())))
    if extra:
        raise NotExported(f"parameter(s) {', '.join(extra)} have no Chaos Mesh equivalent here")
    p = {**o.defaults.get(h.kind, {}), **h.params}
    toxicity = p.get("toxicity", 1.0)
    if isinstance(toxicity, (int, float)) and toxicity != 1.0:
        raise NotExported(f"toxicity={toxicity} (a share of the connections) has no Chaos Mesh "
                          "equivalent: it acts on every packet or request of the pods it selects")
    return p


def _direction(p: dict[str, Any]) -> str:
    d = p.get("direction", "downstream")
    if d not in NET_DIRECTION:
        raise NotExported(f"direction {d!r}: use upstream, downstream or both")
    return d


def _net_link(link: LinkEnds, direction: str, o: Options) -> tuple[dict[str, Any],
                                                                    dict[str, Any]]:
    """(the side whose packets are shaped, the direction and other end)."""
    if link.client is None:
        if direction != "downstream":
            raise NotExported(f"{link.name} direction {direction}: the load generator is outside "
                              "the cluster and Chaos Mesh shapes only what a pod sends to an "
                              "external address (direction to); use direction downstream")
        if not o.client_cidrs:
            raise NotExported(f"{link.name}: give --client-cidr CIDR (where the load comes "
                              "from); without it the router's traffic to the replicas would "
                              "be hit too")
        return _node("router", o), {"direction": "to", "externalTargets": list(o.client_cidrs)}
    return _node(link.client, o), {"direction": NET_DIRECTION[direction],
                                   "target": _node(link.server, o)}


def _http_server(link: LinkEnds, o: Options) -> tuple[dict[str, Any], int]:
    port = (o.router_http_port or o.http_port) if link.server == "router" else o.http_port
    return _node(link.server, o), port


def _network_partition(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("mode",))
    if p.get("mode", "drop") != "drop":
        raise NotExported(f"mode {p.get('mode')!r} (a TCP reset) has no equivalent: Chaos Mesh's "
                          "partition drops packets; mode drop exports")
    return [Chaos("NetworkChaos", {**pods, "action": "partition", "direction": "both"}, name)
            for name, pods in pods_for(h.target, o)]


def _packet_loss(h: Held, o: Options) -> list[Chaos]:
    prob = float(_params(h, o, ("probability",))["probability"])
    if not 0 < prob <= 1:
        raise NotExported(f"probability {prob} must be in (0, 1]")
    return [Chaos("NetworkChaos", {**pods, "action": "loss", "loss": {"loss": num(prob * 100)}},
                  name) for name, pods in pods_for(h.target, o)]


def _network_latency(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("latency_ms", "jitter_ms", "direction", "toxicity"))
    latency, jitter = float(p["latency_ms"]), float(p.get("jitter_ms") or 0)
    if latency < 0 or jitter < 0:
        raise NotExported(f"latency_ms={latency}, jitter_ms={jitter}: must be 0 or more")
    delay = {"latency": f"{num(latency)}ms"}
    if jitter:
        delay["jitter"] = f"{num(jitter)}ms"
    d = _direction(p)
    out = []
    for link in links_for(h.target, o):
        side, rest = _net_link(link, d, o)
        out.append(Chaos("NetworkChaos", {**side, "action": "delay", "delay": delay, **rest},
                         link.name))
    return out


def _bandwidth_limit(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("rate_kbps", "direction", "toxicity", "slice_average_size",
                       "slice_size_variation", "slice_delay_us"))
    if p.get("slice_average_size") is not None:
        raise NotExported("the slicer (slice_average_size) has no Chaos Mesh equivalent; leave it "
                          "out to export the bandwidth limit alone")
    kbps = float(p["rate_kbps"])
    if kbps >= 1 and kbps.is_integer():
        rate = f"{int(kbps)}kbps"
    elif round(kbps * 1000) >= 1:
        rate = f"{round(kbps * 1000)}bps"
    else:
        raise NotExported(f"rate_kbps={kbps}: below 1 byte per second")
    bandwidth = {"rate": rate, "limit": BANDWIDTH_LIMIT, "buffer": BANDWIDTH_BUFFER}
    d = _direction(p)
    out = []
    for link in links_for(h.target, o):
        side, rest = _net_link(link, d, o)
        out.append(Chaos("NetworkChaos", {**side, "action": "bandwidth", "bandwidth": bandwidth,
                                          **rest}, link.name))
    return out


def _connection_reset(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("timeout_ms", "direction", "toxicity", "after_bytes"))
    if p.get("timeout_ms") or p.get("after_bytes"):
        raise NotExported(f"timeout_ms={p.get('timeout_ms')}, after_bytes={p.get('after_bytes')}: "
                          "a reset mid-stream has no equivalent (HTTPChaos aborts a request or "
                          "a response as a whole); timeout_ms=0 and after_bytes=0 export")
    target = HTTP_TARGET[_direction(p)]
    out = []
    for link in links_for(h.target, o):
        pods, port = _http_server(link, o)
        out.append(Chaos("HTTPChaos", {**pods, "target": target, "port": port, "abort": True},
                         link.name))
    return out


def _http_fault(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("mode", "toxicity", "status", "body", "delay_ms", "after_events",
                       "after_bytes"))
    mode = p.get("mode", "abort")
    if mode not in HTTP_MODES:
        raise NotExported(f"mode {mode!r} is unknown (Ordeal's modes: {', '.join(HTTP_MODES)})")
    attrs = {**HTTP_MODES[mode][1], **{k: v for k, v in h.params.items()
                                        if k not in ("mode", "toxicity")}}
    if mode == "abort":
        status = int(attrs["status"])
        body = attrs.get("body") or json.dumps({"error": {
            "object": "error", "type": "ordeal_fault", "code": status,
            "message": f"ordeal http_fault (Chaos Mesh): injected HTTP {status}"}})
        action: dict[str, Any] = {"replace": {
            "code": status, "headers": {"Content-Type": "application/json"},
            "body": base64.b64encode(str(body).encode()).decode()}}
    elif mode == "delay_head":
        action = {"delay": f"{num(float(attrs['delay_ms']))}ms"}
    else:
        raise NotExported(f"mode {mode!r} acts inside a response stream; HTTPChaos replaces or "
                          "patches whole bodies (abort and delay_head export)")
    out = []
    for link in links_for(h.target, o):
        pods, port = _http_server(link, o)
        out.append(Chaos("HTTPChaos", {**pods, "target": "Response", "port": port, **action},
                         link.name))
    return out


def _containers(o: Options) -> dict[str, Any]:
    return {"containerNames": [o.container]} if o.container else {}


def _clock_drift(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("mode", "offset_s", "rate", "strobe_period_s"))
    if p.get("mode", "offset") != "offset":
        raise NotExported(f"mode {p.get('mode')!r}: TimeChaos moves a clock by a fixed offset "
                          "only (no rate, no back and forth); mode offset exports")
    offset = duration(float(p["offset_s"]))
    return [Chaos("TimeChaos", {**pods, **_containers(o), "timeOffset": offset,
                                "clockIds": ["CLOCK_REALTIME"]}, name)
            for name, pods in pods_for(h.target, o)]


def _process_kill(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("restart", "scope"))
    if not p.get("restart", True):
        raise NotExported("restart=false keeps the node down after the heal, and Kubernetes "
                          "brings a killed pod or container back at once")
    if p.get("scope", "node") != "node":
        raise NotExported(f"scope {p.get('scope')!r} kills one process inside the node; Chaos "
                          "Mesh kills whole pods or containers (scope node exports)")
    extra = {"gracePeriod": 0} if o.kill == "pod-kill" else _containers(o)
    return [Chaos("PodChaos", {**pods, "action": o.kill, **extra}, name)
            for name, pods in pods_for(h.target, o)]


def _gpu_memory_pressure(h: Held, o: Options) -> list[Chaos]:
    p = _params(h, o, ("backend", "mb", "fraction", "device"))
    if p.get("backend") != "cpu":
        raise NotExported(f"backend {p.get('backend')!r} takes GPU memory where there is a GPU, "
                          "and Chaos Mesh has no GPU memory stressor; backend='cpu' (host RAM, "
                          "mb) exports as StressChaos")
    mb = int(p["mb"])
    if mb <= 0:
        raise NotExported(f"mb={mb}: must be 1 or more")
    stress = {"stressors": {"memory": {"workers": 1, "size": f"{mb}MiB"}}}
    return [Chaos("StressChaos", {**pods, **_containers(o), **stress}, name)
            for name, pods in pods_for(h.target, o)]


MAPPERS: dict[str, Callable[[Held, Options], list[Chaos]]] = {
    "network_partition": _network_partition, "packet_loss": _packet_loss,
    "network_latency": _network_latency, "bandwidth_limit": _bandwidth_limit,
    "connection_reset": _connection_reset, "http_fault": _http_fault,
    "clock_drift": _clock_drift, "process_kill": _process_kill,
    "gpu_memory_pressure": _gpu_memory_pressure,
}


def map_fault(h: Held, o: Options) -> Exported | LeftOut:
    """One held fault as Chaos Mesh objects, or why it cannot be."""
    why = no_equivalent(h.kind)
    if why is not None:
        return LeftOut(h, why)
    mapper = MAPPERS[h.kind]
    if h.hold_s <= 0:
        return LeftOut(h, "held 0 s (its heal is at its inject's time)")
    try:
        return Exported(h, tuple(mapper(h, o)))
    except NotExported as e:
        return LeftOut(h, str(e))
    except (KeyError, TypeError, ValueError) as e:
        return LeftOut(h, f"parameters {h.params} cannot be read ({type(e).__name__}: {e})")


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


def _dash(kind: str) -> str:
    return kind.replace("_", "-")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "x"


def _labels(o: Options, h: Held | None = None) -> dict[str, str]:
    labels = {MANAGED_BY: "ordeal", RUN_ID: o.run_id}
    if h is not None:
        labels.update({STEP: h.label, KIND: h.kind})
    return labels


def _metadata(name: str, o: Options, h: Held | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": o.namespace, "labels": _labels(o, h)}
    notes = {AT_S: num(h.at_s), HOLD_S: num(h.hold_s)} if h is not None else {}
    if o.source:
        notes[SOURCE] = o.source
    if notes:
        meta["annotations"] = notes
    return meta


def overlapping(exported: Sequence[Exported]) -> bool:
    """Whether any exported fault starts before an earlier one is healed."""
    end = 0.0
    for e in exported:
        if e.held.at_s < end:
            return True
        end = max(end, e.held.heal_s)
    return False


def workflow(exported: Sequence[Exported], o: Options) -> dict[str, Any]:
    """The Workflow that runs the exported faults at their times (the
    module's doc: Serial with Suspend gaps, or Parallel when they overlap)."""
    form = "Parallel" if overlapping(exported) else "Serial"
    templates: list[dict[str, Any]] = []
    children: list[str] = []
    end = 0.0
    for e in exported:
        h = e.held
        wait = round(h.at_s - end, 3) if form == "Serial" else h.at_s
        gap = []
        if wait > 0:
            templates.append({"name": f"wait-{h.label}", "templateType": "Suspend",
                              "deadline": duration(wait)})
            gap = [f"wait-{h.label}"]
        step = _fault_templates(e, templates)
        if form == "Serial":
            children += [*gap, step]
            end = h.heal_s
        else:
            templates.append({"name": f"at-{h.label}", "templateType": "Serial",
                              "children": [*gap, step]})
            children.append(f"at-{h.label}")
    templates.insert(0, {"name": ENTRY, "templateType": form, "children": children})
    meta = _metadata(f"ordeal-{o.run_id}", o)
    return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": meta,
            "spec": {"entry": ENTRY, "templates": templates}}


def _fault_templates(e: Exported, templates: list[dict[str, Any]]) -> str:
    """Add one fault's chaos template(s); returns the name the entry runs."""
    h = e.held
    base = f"{h.label}-{_dash(h.kind)}"
    names = [base] if len(e.chaos) == 1 else [f"{base}-{i}" for i in range(len(e.chaos))]
    if len(e.chaos) > 1:
        templates.append({"name": base, "templateType": "Parallel", "children": names})
    for name, c in zip(names, e.chaos):
        templates.append({"name": name, "templateType": c.crd, "deadline": duration(h.hold_s),
                          EMBED[c.crd]: c.spec})
    return base


def standalone(e: Exported, o: Options, width: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """``[(file stem, object)]``: each of the fault's objects on its own,
    with ``duration`` (not for a one-shot kill), to apply by hand at the
    time its annotation ``ordeal/at-s`` gives."""
    h = e.held
    out = []
    for i, c in enumerate(e.chaos):
        suffix = f"-{i}" if len(e.chaos) > 1 else ""
        spec = dict(c.spec) if c.one_shot else {**c.spec, "duration": duration(h.hold_s)}
        obj = {"apiVersion": API_VERSION, "kind": c.crd,
               "metadata": _metadata(f"ordeal-{o.run_id}-{h.label}{suffix}", o, h),
               "spec": spec}
        out.append((f"f{h.n:0{width}d}-{_dash(h.kind)}-{_slug(c.target)}", obj))
    return out


@dataclass
class Export:
    options: Options
    exported: list[Exported]
    left_out: list[LeftOut]
    workflow: dict[str, Any] | None  # None when nothing could be exported
    objects: list[tuple[str, dict[str, Any]]]  # (file stem under steps/, object)

    @property
    def form(self) -> str:
        return self.workflow["spec"]["templates"][0]["templateType"] if self.workflow else ""


def export(steps: Sequence[Step], o: Options) -> Export:
    """The whole schedule as Chaos Mesh objects. Pure."""
    check_options(o)
    exported: list[Exported] = []
    left: list[LeftOut] = []
    held = held_faults(steps)
    for h in held:
        r = map_fault(h, o)
        (exported if isinstance(r, Exported) else left).append(r)  # type: ignore[arg-type]
    width = max(2, len(str(len(held) - 1)))
    objects = [x for e in exported for x in standalone(e, o, width)]
    return Export(o, exported, left, workflow(exported, o) if exported else None, objects)


# ------------------------------------------------------------------ YAML

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
#: Words YAML 1.1 (PyYAML, kubectl's parser before 1.2) reads as booleans or null.
_NOT_PLAIN = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no YAML form here")
        return repr(v)
    s = str(v)
    if _PLAIN.fullmatch(s) and s.lower() not in _NOT_PLAIN:
        return s
    out = []
    for ch in s:  # a YAML double-quoted scalar, every non-ASCII character escaped
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def _nested(v: Any) -> bool:
    return isinstance(v, (dict, list)) and len(v) > 0


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return _scalar(v)


def _block(v: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(v, dict):
        for k, x in v.items():
            if _nested(x):
                lines.append(f"{pad}{_scalar(str(k))}:")
                _block(x, indent + 2, lines)
            else:
                lines.append(f"{pad}{_scalar(str(k))}: {_inline(x)}")
    else:
        for x in v:
            if _nested(x):
                sub: list[str] = []
                _block(x, indent + 2, sub)
                lines.append(f"{pad}- {sub[0][indent + 2:]}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_inline(x)}")


def to_yaml(doc: dict[str, Any]) -> str:
    """One YAML document in block style (what kubectl reads)."""
    lines: list[str] = []
    _block(doc, 0, lines)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ the files

def describe(c: Chaos) -> str:
    """``NetworkChaos delay on router-replica-0``, ``HTTPChaos abort ...``."""
    if c.crd == "HTTPChaos":
        what = "/".join(k for k in ("abort", "delay", "replace") if k in c.spec)
    elif c.crd == "TimeChaos":
        what = f"timeOffset {c.spec['timeOffset']}"
    elif c.crd == "StressChaos":
        what = "memory " + c.spec["stressors"]["memory"]["size"]
    else:
        what = c.spec.get("action", "")
    return f"{c.crd} {what} on {c.target}"


def summary_lines(x: Export, out: Path | None = None, fmt: str = "yaml") -> list[str]:
    o = x.options
    lines = [(f"{SUMMARY_HEAD} of {o.source or 'a schedule'} (Chaos Mesh {CHAOS_MESH_VERSION} "
              f"CRDs): run id {o.run_id}, namespace {o.namespace}")]
    total = len(x.exported) + len(x.left_out)
    lines.append(f"{len(x.exported)} of {total} fault(s) exported, {len(x.left_out)} not")
    if x.workflow:
        lines.append(f"workflow ordeal-{o.run_id}: {x.form} "
                     + ("(faults in turn, Suspend for the quiet gaps)" if x.form == "Serial" else
                        "(the faults overlap: one Serial branch per fault, Suspend until its "
                        "time)"))
    for e in x.exported:
        h = e.held
        lines.append(f"  exported {h.label} at {num(h.at_s)} s held {num(h.hold_s)} s: "
                     f"{h.kind} on {h.target} -> {', '.join(describe(c) for c in e.chaos)}")
    by_reason: dict[tuple[str, str, str], list[Held]] = {}
    for left in x.left_out:
        h = left.held
        by_reason.setdefault((h.kind, h.target, left.reason), []).append(h)
    for (kind, target, reason), hs in by_reason.items():
        when = ", ".join(f"{h.label} at {num(h.at_s)} s" for h in hs)
        lines.append(f"  NOT exported {kind} on {target} ({when}): {reason}")
    kinds = list(dict.fromkeys(e.held.kind for e in x.exported))
    if kinds:
        lines.append("how each exported kind differs from Ordeal's own fault:")
        lines += [f"  {k}: {NOTES[k]}" for k in kinds if k in NOTES]
    if x.workflow:
        where = f"{out}/" if out else ""
        lines.append(f"run it:   kubectl apply -f {where}workflow.{fmt}   (steps/: one fault at "
                     "a time, by hand, at its ordeal/at-s)")
        lines.append(f"stop it:  kubectl delete workflow -n {o.namespace} ordeal-{o.run_id}   "
                     "(its chaos objects go with it)")
        lines.append(f"by hand:  kubectl delete networkchaos,podchaos,timechaos,stresschaos,"
                     f"httpchaos -n {o.namespace} -l {RUN_ID}={o.run_id}")
    return lines


def write_export(x: Export, out: Path, fmt: str = "yaml",
                 say: Callable[[str], None] = lambda _: None) -> list[Path]:
    """Write the workflow, the standalone objects and summary.txt under
    ``out``. ``out`` must be new, empty, or an earlier export (whose files
    are replaced). Returns the paths written."""
    if fmt not in ("yaml", "json"):
        raise ExportError(f"--format {fmt!r}: use yaml or json")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        summary = out / SUMMARY
        if not (summary.is_file() and summary.read_text().startswith(SUMMARY_HEAD)):
            raise ExportError(f"--out {out}: not empty and not an earlier export (no {SUMMARY}); "
                              "give a new or empty directory")
        for old in [*out.glob("workflow.*"), summary]:
            old.unlink()
        if (out / "steps").is_dir():
            shutil.rmtree(out / "steps")
        say(f"replacing the earlier export in {out}")
    out.mkdir(parents=True, exist_ok=True)
    if x.objects:
        (out / "steps").mkdir()

    o = x.options
    head = (f"# Written by `python -m faults export --chaos-mesh` from "
            f"{o.source or 'a schedule'} (run id {o.run_id}); see {SUMMARY}\n")

    def dump(obj: dict[str, Any]) -> str:
        return json.dumps(obj, indent=2) + "\n" if fmt == "json" else head + to_yaml(obj)

    written = []
    if x.workflow is not None:
        path = out / f"workflow.{fmt}"
        path.write_text(dump(x.workflow))
        written.append(path)
        say(f"wrote {path} (Workflow ordeal-{o.run_id}, {x.form})")
    for stem, obj in x.objects:
        path = out / "steps" / f"{stem}.{fmt}"
        path.write_text(dump(obj))
        written.append(path)
        say(f"wrote {path} ({obj['kind']} {obj['metadata']['name']})")
    path = out / SUMMARY
    path.write_text("\n".join(summary_lines(x, out, fmt)) + "\n")
    written.append(path)
    return written
