"""Issue 39: paths where a broken stack got ``pass``, each planted.

- A single-fault suite judges the whole verdict (``FaultRun.assert_verdict``):
  a wrong answer, a lost or a repeated request fails it, with the invariant
  and its counterexample; a known finding does not.
- Every suite test that runs a cluster ends with a verdict judgement.
- ``engine_consistency`` that cannot be judged stays in the verdict, as
  "unknown" with why; ``health_truthful`` without a token counter read is
  "unknown", never True.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from runs.options import require_judged_names
from invariants import HealthTruthful, RunContext
from ordeal.config import ConfigError
from ordeal.history.ops import Op
from reports.run_dir import RunDir
from reports.summary import judge_verdict
from runs.run import OrdealRun, assert_verdict, verdict_problems
from runs.single_fault import FaultRun

ROOT = Path(__file__).resolve().parent.parent
S = 1_000_000_000


def inv(name, valid, counterexamples=None, **details):
    return {"name": name, "valid": valid, "details": details,
            "counterexamples": counterexamples or []}


def summary_of(*invariants, errors=(), require_judged=()):
    verdict, scope = judge_verdict(list(invariants), errors, require_judged)
    return {"run_id": "r1", "invariants": list(invariants), "errors": list(errors),
            "verdict": verdict, "scope": scope}


def test_a_wrong_answer_fails_a_single_fault_run_naming_invariant_and_example():
    wrong = {"index": 41, "problem": "greedy output differs from the golden baseline",
             "expected": "the cat", "got": "XXXX"}
    s = summary_of(inv("fault_effective", True), inv("canary_determinism", False, [wrong]))
    r = FaultRun(s, {}, {})
    with pytest.raises(AssertionError) as e:
        r.assert_verdict()
    text = str(e.value)
    assert "canary_determinism: false" in text and "XXXX" in text and "r1" in text


def test_known_findings_and_cluster_limits_pass_unknowns_and_errors_do_not():
    known = inv("failover", False, [{"window": "process_pause@replica-1#1"}])
    known["known"] = [{"invariant": "failover"}]
    external = inv("no_orphans", "unknown", not_judgeable={"process_tree": "not ours"})
    assert verdict_problems(summary_of(inv("goodput", True), known, external)) == []
    assert_verdict(summary_of(inv("goodput", True), known))
    crashed = inv("leak_bound", "unknown", error="KeyError: 'rss'")
    [p] = verdict_problems(summary_of(inv("goodput", True), crashed))
    assert p.startswith("leak_bound: unknown") and "KeyError" in p
    [p] = verdict_problems(summary_of(inv("goodput", True), errors=["history damaged"]))
    assert "harness error: history damaged" in p


def test_a_pass_on_a_cluster_that_cannot_judge_everything_names_its_scope():
    """Issue 47: what an external deployment cannot give is left out of the
    verdict and named first in its scope; ``--require-judged`` puts it back,
    and a run that could not judge it is then not accepted."""
    failover = inv("failover", "unknown", not_judgeable={
        "node_attribution": "the replicas do not name themselves"})
    s = summary_of(inv("goodput", True), failover)
    assert s["verdict"] == "pass"
    assert s["scope"]["complete"] is False and s["scope"]["judged"] == ["goodput"]
    assert s["scope"]["not_judged"]["failover"]["why"].startswith("node_attribution: the rep")
    assert_verdict(s)
    required = summary_of(inv("goodput", True), failover, require_judged=("failover",))
    assert required["verdict"] == "unknown"
    [p] = verdict_problems(required)
    assert p.startswith("failover: not judged on this cluster, and --require-judged names it")
    with pytest.raises(AssertionError, match="require-judged"):
        assert_verdict(required)
    # Required and not run at all (no checker of this run judges it): no pass.
    absent = summary_of(inv("goodput", True), require_judged=("failover",))
    assert absent["verdict"] == "unknown" and absent["scope"]["not_judged"]["failover"] == {
        "why": "no checker of this run judges it (not run here)", "required": True}
    assert verdict_problems(absent) == [
        "failover: --require-judged names it, and no checker of this run judges it"]
    # A finding stands whatever the scope; nothing judged is no pass.
    assert summary_of(inv("goodput", False), failover)["verdict"] == "fail"
    assert summary_of(failover)["verdict"] == "unknown"
    assert summary_of(inv("goodput", True))["scope"] == {
        "complete": True, "judged": ["goodput"], "not_judged": {}, "require_judged": []}


def test_every_suite_test_that_runs_a_cluster_judges_the_whole_verdict():
    """A suite that checks only its fault's effect lets a broken stack pass:
    each test function of suites/ that takes ``ordeal_run`` calls
    ``assert_verdict`` (directly or on its FaultRun) or
    ``verdicts_allowed``, or judges its own checkers (explore, replay)."""
    judges = {"assert_verdict", "verdicts_allowed", "judge_exploration", "broken"}
    missing = []
    for path in sorted((ROOT / "suites").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in tree.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
                continue
            if "ordeal_run" not in {a.arg for a in fn.args.args}:
                continue
            called = {n.func.attr if isinstance(n.func, ast.Attribute) else
                      getattr(n.func, "id", None)
                      for n in ast.walk(fn) if isinstance(n, ast.Call)}
            if not called & judges:
                missing.append(f"{path.relative_to(ROOT)}::{fn.name}")
    assert missing == [], missing


def sample(t, tokens=None, running=2):
    metrics = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": 0}
    if tokens is not None:
        metrics["vllm:generation_tokens_total"] = tokens
    return Op(0, int(t * S), "w", "info", "monitor", "sample",
              {"node": "replica-0", "pid": 10, "health": 200, "metrics": metrics,
               "rss_bytes": 2**30})


def test_health_truthful_without_a_token_counter_is_unknown_not_true():
    """A node whose /health says 200 while busy, and whose token counter was
    never read: whether it made progress cannot be told."""
    r = HealthTruthful().check([sample(t) for t in range(0, 30, 2)], RunContext())
    assert r.valid == "unknown" and "generation_tokens_total" in r.details["why"], r
    r = HealthTruthful().check([sample(t, tokens=t * 10.0) for t in range(0, 30, 2)],
                               RunContext())
    assert r.valid is True and r.details["counter_reads"] == 15


class _NoEngineData:
    """A cluster whose engine's own records cannot be compared: every
    replica restarted (here: no load ran, so no mark was taken)."""
    engine = "vllm"
    links = ()

    def replicas(self):
        return []

    def describe(self):
        return {"engine": "vllm", "nodes": []}


def test_engine_consistency_that_cannot_be_judged_stays_in_the_verdict(tmp_path):
    run = OrdealRun(RunDir.create(tmp_path, "t"), "t", _NoEngineData(), progress=lambda _m: None)
    results = run.check(None)
    [ec] = [r for r in results if r.name == "engine_consistency"]
    assert ec.valid == "unknown" and ec.details.get("why"), ec
    summary = run.finish()
    assert "engine_consistency" in {i["name"] for i in summary["invariants"]}
    assert summary["verdict"] != "pass", summary["verdict"]


def _exploration(tmp_path, **kw):
    from runs.explore_machine import Exploration
    ctx = Exploration(cluster=None, run_dir=tmp_path, say=lambda _m: None, deadline=0.0)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def test_an_exploration_fails_when_nothing_ran_or_the_stack_broke_before_any_fault(tmp_path):
    from runs.explore_machine import judge_exploration
    [p] = judge_exploration(_exploration(tmp_path))
    assert "no example ran" in p
    broke = [{"example": "example-001.jsonl", "broke": ["stream_wellformed"], "program": []}]
    [p] = judge_exploration(_exploration(tmp_path, examples=3, unattributed=broke))
    assert "before any fault" in p and "stream_wellformed" in p
    unjudged = [{"example": "example-002.jsonl", "checkers": ["no_silent_loss: KeyError"]}]
    [p] = judge_exploration(_exploration(tmp_path, examples=3, unjudged=unjudged))
    assert "could not judge" in p
    assert judge_exploration(_exploration(tmp_path, examples=3)) == []


def test_a_crashed_checker_is_not_a_pass_of_an_exploration():
    from invariants import Result
    from runs.explore import broken, crashed
    results = [Result("no_silent_loss", True, {}),
               Result("stream_wellformed", "unknown", {"error": "ValueError: bad"})]
    assert broken(results) == [] and crashed(results) == ["stream_wellformed: ValueError: bad"]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_wrong_answer_inside_a_single_fault_run_fails_the_suite(ordeal_run, ordeal_cluster):
    """What ``pytest suites/faults -m faults`` now does with a stack that
    misbehaves during a single-fault run: a latency fault on the
    client-router link (its effect seen, the cluster recovered) while, from
    8 s into the load, every streamed answer comes back as other text in a
    well-formed stream (the fault proxy's ``sse_rewrite_text``: a replica
    serving wrong tokens). The suite's own assertions pass; the verdict
    does not, and says which invariant and which answer."""
    import threading

    from faults.proxy.client import ProxyClient
    from runs.single_fault import run_single_fault

    link = ordeal_cluster.link("client-router")
    proxy = ProxyClient(link.control)
    timer = threading.Timer(8.0, proxy.add_toxic, args=("client-router", "sse_rewrite_text"),
                            kwargs={"name": "planted-wrong-answer",
                                    "attributes": {"text": "WRONG"}})
    timer.start()
    try:
        r = run_single_fault(ordeal_run, "network_latency", "client-router",
                             {"latency_ms": 300, "direction": "downstream"},
                             inject_at_s=4.0, hold_s=4.0, load_s=18.0, after_heal_s=4.0)
    finally:
        timer.cancel()
        proxy.remove_toxic("client-router", "planted-wrong-answer")
    # What a suite that judges only the fault's effect checks: all fine.
    assert r.effect["took_effect"], r.effect
    assert r.phases["fault"].p("ttft_ms") >= r.phases["steady"].p("ttft_ms") + 200, r.brief()
    assert r.phases["after_heal"].ok_share == 1.0, r.brief()
    with pytest.raises(AssertionError) as e:
        r.assert_verdict()
    assert "canary_determinism: false" in str(e.value) and "WRONG" in str(e.value), str(e.value)
    # ... and with the toxic gone, the same cluster answers right again.
    assert ordeal_run.engine.answer_directly(ordeal_cluster.replicas()[0])["status"] == 200


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_replica_that_dies_on_its_own_fails_the_run_and_is_started_before_the_next(
        ordeal_run, ordeal_cluster, ordeal_config):
    """A replica that crashes with no fault of Ordeal's, behind a router
    that fails over: the clients may see nothing wrong, so the verdict
    must (``nodes_serve_at_end``); and the next run on the shared cluster
    gets it back, recorded (runs/shared_cluster.py). CI, 2026-12-06: a
    Triton replica found dead at the next fault's inject."""
    import signal
    import threading

    from load.spec import WorkloadSpec
    from runs.shared_cluster import revive_down_nodes

    victim = ordeal_cluster.replicas()[-1]
    timer = threading.Timer(3.0, victim.signal, args=(signal.SIGKILL,))
    timer.start()
    try:
        ordeal_run.load(WorkloadSpec(duration_s=10.0, rate=ordeal_config.load_rate, seed=3))
    finally:
        timer.cancel()
    results = {r.name: r for r in ordeal_run.check()}
    summary = ordeal_run.finish()
    dead = results["nodes_serve_at_end"]
    assert dead.valid is False and dead.counterexamples[0]["node"] == victim.name, dead
    assert summary["verdict"] == "fail", summary["verdict"]
    said: list[str] = []
    [record] = revive_down_nodes(ordeal_cluster, ordeal_config.cluster.ready_timeout_s,
                                 said.append)
    assert record["node"] == victim.name and record["exit_code"] == -signal.SIGKILL, record
    assert victim.is_running() and ordeal_run.engine.answer_directly(victim)["status"] == 200


def test_the_rewrite_toxic_changes_only_the_text_after_its_first_events():
    import json

    from faults.proxy.sse import SseEvent
    from faults.proxy.toxics import build_toxic

    toxic = build_toxic({"type": "sse_rewrite_text", "direction": "downstream",
                         "attributes": {"after_events": 1, "text": "X"}})
    chunk = {"id": "c1", "choices": [{"index": 0, "text": "cat", "token_ids": [7]}]}
    first = SseEvent.of_data(json.dumps(chunk), 0)
    assert toxic.on_event(None, first) == [first]  # before after_events: untouched
    [out] = toxic.on_event(None, SseEvent.of_data(json.dumps(chunk), 1))
    assert json.loads(out.data) == {**chunk, "choices": [{"index": 0, "text": "X",
                                                          "token_ids": [7]}]}
    chat = {"choices": [{"delta": {"content": "dog"}}]}
    [out] = toxic.on_event(None, SseEvent.of_data(json.dumps(chat), 2))
    assert json.loads(out.data)["choices"][0]["delta"]["content"] == "X"
    done = SseEvent.of_data("[DONE]", None)
    assert toxic.on_event(None, done) == [done]


def test_the_nemesis_smoke_holds_each_stopping_fault_past_the_shipped_ejection_bound():
    """A router that never ejects a paused or cut replica sends to it for
    the whole hold: the nemesis smoke must hold those faults longer than the
    shipped known finding's ``max_ejection_s``, or such a router is
    "known" and passes. Every seed's schedule runs each kind at least once."""
    from invariants.known import SHIPPED_DIR, read_known_findings
    from suites.test_nemesis import MIN_DURATION_S, smoke_schedule

    [shipped] = sorted(SHIPPED_DIR.glob("*.toml"))
    bounds = [f.bounds["max_ejection_s"] for f in read_known_findings(shipped).findings
              if f.invariant == "failover"]
    assert bounds, "the shipped file lists the router's slow ejection"
    for seed in range(200):
        steps, kept, _ = smoke_schedule(MIN_DURATION_S, seed, {})
        assert {s.kind for s in steps} == {c.kind for c in kept}, (seed, steps)
        injects = {s.key: s for s in steps if s.action == "inject"}
        for heal in (s for s in steps if s.action == "heal"):
            inject = injects[heal.key]
            if inject.kind in ("process_pause", "network_partition"):
                assert heal.at_s - inject.at_s > max(bounds) + 0.4, (seed, inject, heal)


def test_require_judged_takes_invariant_names_and_refuses_others():
    assert require_judged_names("failover, fault_slo,failover") == ("failover", "fault_slo")
    assert require_judged_names("") == ()
    with pytest.raises(ConfigError, match=r"unknown invariant\(s\) \['failovr'\]; name some of"):
        require_judged_names("failovr")
