"""One fault, once, under load: what every suite in ``suites/faults/`` does.

``run_single_fault`` schedules one inject and its heal inside a short load,
checks the history with every default checker, writes the summary, and
returns the run split by phase (steady, during the fault, after the heal,
and the warm-up when the run's ``warmup_s`` sets one):
how many requests ended how, which nodes served them, their latencies, and
what the monitor saw of each node. A suite then asserts the fault's effect
in the ``fault`` phase and the cluster's recovery in ``after_heal``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from faults.catalogue import backend_kinds
from faults.schedule import Step
from invariants.histogram import LatencyHistogram
from invariants.requests import STEADY, WARMUP, Request, RequestPairer, Timeline
from load.spec import WorkloadSpec
from ordeal import kinds as kind_traits
from ordeal.history.ops import MONITOR
from ordeal.history.reader import read_history
from runs.run import OrdealRun, assert_verdict

#: ``hold`` is the part of ``fault`` where the fault alone acted: requests
#: invoked after the inject took effect (its end op) that ended before the
#: heal began. ``fault`` also holds the requests in flight at the inject,
#: whose answer may have passed before the fault was in place (a reset
#: toxic cuts only the bytes it sees); and a heal that restarts something (a
#: Ray node's engines) is an outage of its own, inside ``fault`` but not
#: inside ``hold``.
PHASES = (STEADY, "fault", "after_heal", "hold", WARMUP)


@dataclass
class PhaseStats:
    requests: int = 0
    types: Counter = field(default_factory=Counter)  # ok / fail / info
    nodes: Counter = field(default_factory=Counter)  # which replica served (ok only)
    statuses: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # a few, for assertion messages
    latency: dict[str, LatencyHistogram] = field(
        default_factory=lambda: {m: LatencyHistogram() for m in ("ttft_ms", "e2e_ms", "tpot_ms")})
    values: list[dict[str, Any]] = field(default_factory=list)  # ok values (bounded)
    health: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    # per node: the server's clock minus ours (s), from the "created" field
    clock_skew: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def median_skew(self, node: str) -> float | None:
        xs = sorted(self.clock_skew.get(node, []))
        return xs[len(xs) // 2] if xs else None

    def p(self, metric: str, q: float = 50.0) -> float | None:
        return self.latency[metric].quantile(q / 100)

    @property
    def ok_share(self) -> float:
        return self.types["ok"] / self.requests if self.requests else 0.0

    def brief(self) -> dict[str, Any]:
        return {"requests": self.requests, "types": dict(self.types), "nodes": dict(self.nodes),
                "statuses": dict(self.statuses), "ttft_p50": self.p("ttft_ms"),
                "clock_skew_median": {n: self.median_skew(n) for n in self.clock_skew},
                "e2e_p50": self.p("e2e_ms"), "health": {k: dict(v) for k, v in
                                                        self.health.items()},
                "errors": self.errors[:3]}


@dataclass
class FaultRun:
    summary: dict[str, Any]
    phases: dict[str, PhaseStats]
    window: dict[str, Any]  # the fault window from the summary (inject/heal results)

    def brief(self) -> dict[str, Any]:
        return {k: v.brief() for k, v in self.phases.items()}

    def assert_verdict(self) -> None:
        """Fail unless the run's whole verdict is accepted (``runs.run.
        assert_verdict``: known findings applied, every invariant judged):
        the fault's effect and recovery are what the suite asserts itself;
        a stack that answered wrong, lost or repeated a request in the
        same run must fail too."""
        assert_verdict(self.summary)

    @property
    def effect(self) -> dict[str, Any]:
        """fault_effective's judgement of this run's fault: ``took_effect``
        when every window showed its effect in the system's state (the
        heal's observation; clock_drift: the node's clock) or is of a kind
        the target file trusts without evidence (``trusted``), with the
        details and counterexamples that say what was seen. A window with
        no evidence (``not_observable``) did not show its effect."""
        found = [i for i in self.summary.get("invariants", [])
                 if i.get("name") == "fault_effective"]
        d = found[0].get("details", {}) if found else {}
        seen = d.get("effective", 0) + d.get("trusted", 0)
        return {"took_effect": bool(d.get("windows")) and seen == d.get("windows"),
                "details": d, "counterexamples": found[0].get("counterexamples") if found else None}


def split_by_phase(history_path: Any, after_heal_s: float,
                   keep_f: Any = None, warmup_s: float = 0.0) -> dict[str, PhaseStats]:
    """Requests and monitor samples of a history, by the phase they fell in
    (``invariants.requests``: the first ``warmup_s`` of the load are
    ``warmup``, not ``steady``); ``keep_f(f)`` False leaves a request out
    (None keeps all)."""
    timeline = Timeline(after_heal_s, warmup_s)
    pairer = RequestPairer(timeline)
    phases = {p: PhaseStats() for p in PHASES}
    for op in read_history(history_path):
        if op.process == MONITOR and op.f == "sample":
            phase = timeline.phase_at(op.time_ns)[0]
            node = op.value.get("node", "?")
            phases[phase].health[node][str(op.value.get("health"))] += 1
            continue
        req = pairer.feed(op)
        if req is None or (keep_f is not None and not keep_f(req.invoke.f)):
            continue
        for s in [phases[req.phase]] + ([phases["hold"]] if _in_hold(req, timeline) else []):
            _count(s, req)
    return phases


def _in_hold(req: Request, timeline: Timeline) -> bool:
    """``req`` (just completed) is in ``hold``: see PHASES."""
    if req.phase != "fault" or timeline.faults.healing or not timeline.faults.open:
        return False
    injected = [w.injected_ns for w in timeline.faults.open.values()]
    return all(t is not None and req.invoke.time_ns >= t for t in injected)


def _count(s: PhaseStats, req: Request) -> None:
    """One completed request into one phase's statistics."""
    s.requests += 1
    s.types[req.done.type] += 1
    v = req.done.value
    if v.get("status") is not None:
        s.statuses[str(v["status"])] += 1
    if req.done.type == "ok":
        s.nodes[str(v.get("node"))] += 1
        for m, h in s.latency.items():
            if isinstance(v.get(m), (int, float)):
                h.add(float(v[m]))
        if len(s.values) < 2000:
            s.values.append(v)
        if isinstance(v.get("created"), int) and len(s.clock_skew[str(v.get("node"))]) < 1000:
            # "created" is stamped when the server took the request.
            ours = datetime.fromisoformat(req.invoke.wall.replace("Z", "+00:00")).timestamp()
            s.clock_skew[str(v.get("node"))].append(round(v["created"] - ours, 1))
    elif len(s.errors) < 20:
        s.errors.append(str(req.done.error))


def skip_unless_runnable(run: OrdealRun, kind: str) -> None:
    """Skip the calling test, with the reason, when this run's engine or
    cluster cannot take ``kind``, or this machine cannot inject it (not
    root, no iptables: ``faults.catalogue.unrunnable_kinds``): before
    anything runs."""
    why = run.engine.unsupported(kind)
    if why:
        pytest.skip(f"{kind} on --engine {run.engine.name}: {why}")
    why = getattr(run.cluster, "unsupported", lambda _kind: None)(kind)
    if why:  # an external deployment without a hook (or the proxy) for it
        pytest.skip(f"{kind} on --cluster external: {why}")
    why = run.unrunnable_kinds.get(kind)
    if why:
        pytest.skip(f"{kind} cannot run here: {why}")
    if kind in backend_kinds() and not getattr(run.cluster, "ray_nodes", None):
        pytest.skip(f"{kind} acts on the simulated nodes of --cluster ray; this run's cluster "
                    f"is --cluster {getattr(run.cluster, 'backend', '?')}")


def run_single_fault(run: OrdealRun, kind: str, target: str, params: dict[str, Any] | None = None,
                     *, inject_at_s: float = 6.0, hold_s: float = 10.0, load_s: float = 24.0,
                     rate: float = 6.0, after_heal_s: float = 10.0, seed: int = 0,
                     max_s: float = 420.0,
                     max_tokens: tuple[int, int] | None = None) -> FaultRun:
    """Load for ``load_s`` (longer if the heal takes time) at ``rate`` req/s,
    with ``kind`` on ``target`` from ``inject_at_s`` for ``hold_s``;
    ``max_tokens`` (a range) asks for answers that long instead of the
    workload's short default. A kind
    the cluster's engine cannot take here is skipped with the engine's
    reason (engines/base.py ``unsupported``), before anything runs."""
    skip_unless_runnable(run, kind)
    steps = [Step(inject_at_s, "inject", kind, target, 0, dict(params or {})),
             Step(inject_at_s + hold_s, "heal", kind, target, 0, dict(params or {}))]
    return run_fault_steps(run, steps, load_s=load_s, rate=rate, after_heal_s=after_heal_s,
                           seed=seed, max_s=max_s, max_tokens=max_tokens)


def run_fault_steps(run: OrdealRun, steps: list[Step], *, load_s: float = 24.0,
                    rate: float = 6.0, after_heal_s: float = 10.0, seed: int = 0,
                    max_s: float = 420.0,
                    max_tokens: tuple[int, int] | None = None) -> FaultRun:
    """``run_single_fault`` for a few steps of the suite's own making (faults
    that overlap: a restart while a co-tenant holds memory): the same load,
    checks and phases. A step's action waits for the one before it, so a
    heal that restarts a node holds back the steps after it. ``window`` is
    the first fault's; ``summary["faults"]`` has them all."""
    spec = WorkloadSpec(duration_s=load_s, rate=rate, seed=seed, timeout_s=20.0)
    if max_tokens is not None:  # long answers: streams are in flight when the fault comes
        spec = dataclasses.replace(spec, max_tokens=max_tokens, timeout_s=90.0)
    run.load(spec, schedule=steps, schedule_seed=seed, after_heal_s=after_heal_s, max_s=max_s)
    run.check()
    summary = run.finish()
    # Kinds that act on HTTP/1.1 exchanges inside the fault proxy
    # (``KindTraits.http1_only``): requests another protocol carries through
    # the same link (Triton's gRPC, HTTP/2) pass them untouched, so their
    # suites judge the requests the engine sends over HTTP/1.1.
    l7 = all((t := kind_traits.of(step.kind)) is not None and t.http1_only for step in steps)
    phases = split_by_phase(run.run_dir.history_path, after_heal_s,
                            run.engine.l7_visible if l7 else None,
                            run.checker_settings.warmup_s)
    window = summary["faults"][0] if summary["faults"] else {}
    return FaultRun(summary, phases, window)


def ray_node_with_replicas(run: OrdealRun) -> str:
    """The name of a simulated Ray node that runs a replica now (asked of
    the actors: earlier node faults move replicas between nodes)."""
    nodes = getattr(run.cluster, "ray_nodes", None) or []
    for node in nodes:
        if node.engines_refreshed():
            return node.name
    return nodes[0].name if nodes else "ray-node-0"
