"""One held fault as Chaos Mesh objects (``map_fault``), or why it cannot
be: a mapper per kind (``MAPPERS``) with what it changes against
Ordeal's own fault (``NOTES``); a kind with no mapper is left out with the
reason it declares (``KindTraits.chaos_mesh_none``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faults.http_fault import MODES as HTTP_MODES
from ordeal import kinds as kind_traits

from .model import KILL_ACTIONS, NODE_WORDS, Held, NotExported, Options, duration, num

#: tbf's queue limit and burst (BandwidthSpec requires both, >= 1): the
#: values of Chaos Mesh's own bandwidth example.
BANDWIDTH_LIMIT = 20_971_520
BANDWIDTH_BUFFER = 10_000
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
        return (f"faults/chaos_mesh/mapping.py has no mapping for {kind} (a mapping is added "
                "to its MAPPERS, with what it changes in NOTES)")
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
