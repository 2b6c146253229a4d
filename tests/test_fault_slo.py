"""fault_slo: while one replica is down, the requests sent after the
failover bound meet the [fault_slo] targets. Histories are planted op by op
(the shapes the workload and the nemesis record); the real runs' figures
come from the pause and partition suites (summary.json ``fault_slo``)."""

from dataclasses import replace

import pytest

from invariants import (
    DEFAULT_CHECKERS,
    CheckerSettings,
    FaultSLO,
    FaultSLOTargets,
    RunContext,
    SLOTargets,
)
from invariants.known import KnownFinding, KnownFindings
from ordeal.config import ConfigError
from ordeal.history.ops import NEMESIS, Op

CTX = RunContext(run_id="t")


class Plan:
    def __init__(self):
        self.ops: list[Op] = []
        self.proc = 0

    def _op(self, t, type, process, f, value, error=None):
        self.ops.append(Op(len(self.ops), int(t * 1e9), "2026-12-02T00:00:00.000Z", type,
                           process, f, value, error))

    def request(self, at, done, node="replica-0", type="ok", error=None, ttft_ms=100.0):
        self.proc += 1
        self._op(at, "invoke", self.proc, "completions", {"seq": self.proc, "stream": True})
        value = {"seq": self.proc, "node": node}
        if type == "ok":
            value.update(ttft_ms=ttft_ms, e2e_ms=(done - at) * 1000, tpot_ms=20.0)
        self._op(done, type, self.proc, "completions", value, error)

    def fault(self, at, healed, kind="process_pause", target="replica-1", error=None):
        v = {"kind": kind, "target": target}
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "begin"})
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "end"}, error)
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "begin"})
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "end"})

    def judge(self, settings=None):
        ops = sorted(self.ops, key=lambda o: o.time_ns)
        ops = [replace(o, index=i) for i, o in enumerate(ops)]
        return FaultSLO().check(ops, RunContext("t", settings) if settings else CTX)


def steady(plan, start, end, every=0.5, node="replica-0"):
    t = start
    while t < end:
        plan.request(t, t + 0.2, node)
        t += every


def test_a_cluster_that_serves_on_after_the_bound_meets_the_fault_slo():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14)
    # Sent to the paused replica before the bound: they wait out the pause,
    # and are failover's business, not this window's judged requests.
    p.request(3.0, 14.2, "replica-1", ttft_ms=11000)
    r = p.judge()
    assert r.valid is True, r.counterexamples
    [w] = r.details["windows_shown"].values()
    assert w["met"] is True and w["goodput"] == 1.0
    assert w["requests"] == 15  # invoked from 7 s to the heal's begin at 14 s, every 0.5 s
    assert r.details["judged"] == 1 and r.details["violations"] == 0


def test_requests_that_waited_out_the_fault_after_the_bound_are_a_violation():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14)
    for at in (8.0, 9.0, 10.0):  # the router still sends there after the bound
        p.request(at, 14.3, "replica-1", ttft_ms=(14.3 - at) * 1000)
    r = p.judge()
    assert r.valid is False
    [w] = r.details["windows_shown"].values()
    assert w["requests"] == 18 and w["goodput"] == round(15 / 18, 4) and w["met"] is False
    assert r.details["violations_by_window"] == {"process_pause@replica-1#1": 1}
    assert len(r.counterexamples) == 3
    assert "missed ttft_ms" in r.counterexamples[0]["problem"]
    assert r.counterexamples[0]["answered_by"] == "replica-1"


def test_failed_requests_count_against_the_window_with_their_error():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14, kind="process_kill")
    for at in (7.2, 8.2, 9.2):
        p.request(at, at + 0.01, None, "fail", "HTTP 502: upstream connect error")
    r = p.judge()
    assert r.valid is False
    assert "ended fail: HTTP 502" in r.counterexamples[0]["problem"]


def test_targets_and_the_goodput_bound_come_from_the_settings():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14)
    p.request(8.0, 8.5, "replica-0", ttft_ms=450)  # slow, not stalled
    assert p.judge().valid is True  # 450 ms is within the default 4000 ms
    strict = CheckerSettings(fault_slo=replace(FaultSLOTargets(), ttft_ms=400.0,
                                               min_goodput=1.0))
    assert p.judge(strict).valid is False
    later = CheckerSettings(slo=replace(SLOTargets(), failover_bound_s=6.5),
                            fault_slo=strict.fault_slo)
    r = p.judge(later)  # 8.0 s is 6.0 s into the fault: before this bound, not judged
    assert r.valid is True and r.details["failover_bound_s"] == 6.5


def test_windows_without_a_spare_replica_or_with_too_few_requests_are_shown_not_judged():
    p = Plan()
    steady(p, 0, 20)  # only replica-0 ever answers
    p.fault(2, 14, target="replica-0")
    r = p.judge()
    assert r.valid is True and r.details["alone"] == 1 and r.details["judged"] == 0
    q = Plan()
    steady(q, 0, 2, node="replica-1")
    q.request(2.5, 2.6)
    q.fault(2, 8)  # judged from 7 s to 8 s: two requests at most
    q.request(7.2, 12.0, "replica-1", ttft_ms=4800)
    r = q.judge()
    assert r.valid is True and r.details["too_few_requests"] == 1
    [w] = r.details["windows_shown"].values()
    assert "fewer than min_requests" in w["why"] and w["goodput"] == 0.0


def test_faults_that_do_not_stop_a_replica_are_not_its_business():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14, kind="network_latency", target="client-router")
    p.fault(3, 15, kind="gpu_throttle", target="replica-1")
    r = p.judge()
    assert r.valid is True and r.details["windows"] == 0


def test_a_known_finding_covers_its_window_and_only_it():
    p = Plan()
    steady(p, 0, 2, node="replica-1")
    steady(p, 0, 20)
    p.fault(2, 14)
    for at in (8.0, 9.0, 10.0):
        p.request(at, 14.3, "replica-1", ttft_ms=(14.3 - at) * 1000)
    inv = p.judge().to_dict()
    known = KnownFindings("f.toml", "x", (KnownFinding("fault_slo", "slow ejection", "here",
                                                       "process_pause", "replica-*"),))
    known.apply([inv], [])
    assert inv["known"][0]["reason"] == "slow ejection"
    other = KnownFindings("f.toml", "x", (KnownFinding("fault_slo", "r", "t",
                                                       "network_partition"),))
    inv2 = p.judge().to_dict()
    other.apply([inv2], [])
    assert "known" not in inv2


def test_fault_slo_is_read_from_the_slo_file_beside_slo(tmp_path):
    f = tmp_path / "slo.toml"
    f.write_text("[slo]\nttft_ms = 1500\n\n[fault_slo]\nttft_ms = 3000\nmin_goodput = 0.8\n")
    assert SLOTargets.from_file(f).ttft_ms == 1500
    fs = FaultSLOTargets.from_file(f)
    assert fs.ttft_ms == 3000 and fs.min_goodput == 0.8 and fs.e2e_ms == 20000
    bare = tmp_path / "bare.toml"
    bare.write_text("ttft_ms = 1500\n")  # a file of bare keys is [slo]
    assert SLOTargets.from_file(bare).ttft_ms == 1500
    assert FaultSLOTargets.from_file(bare) == FaultSLOTargets()
    bad = tmp_path / "bad.toml"
    bad.write_text("[fault_slo]\nttft = 3000\n")
    with pytest.raises(ConfigError, match=r"\[fault_slo\]: unknown key\(s\) \['ttft'\]"):
        FaultSLOTargets.from_file(bad)
    stray = tmp_path / "stray.toml"
    stray.write_text("[slo]\nttft_ms = 1\n[fautl_slo]\nttft_ms = 2\n")
    with pytest.raises(ConfigError, match="fautl_slo"):
        SLOTargets.from_file(stray)
    settings = CheckerSettings(fault_slo=fs)
    assert CheckerSettings.from_overrides(settings.overrides(), "here") == settings


def test_it_is_a_default_checker():
    assert FaultSLO in DEFAULT_CHECKERS


def test_memory_is_bounded_by_window_rows_not_run_length():
    from invariants.fault_slo import MAX_WINDOW_ROWS
    p = Plan()
    steady(p, 0, 1, node="replica-1")
    n = 3 * MAX_WINDOW_ROWS
    for i in range(n):
        t = 2 + 20 * i
        steady(p, t, t + 20)
        p.fault(t, t + 14)
        for at in (t + 8, t + 9, t + 10):  # each window: three stalled after the bound
            p.request(at, t + 14.3, "replica-1", ttft_ms=5000)
    checker = FaultSLO()
    ops = sorted(p.ops, key=lambda o: o.time_ns)
    r = checker.check([replace(o, index=i) for i, o in enumerate(ops)], CTX)
    assert len(checker.rows) == MAX_WINDOW_ROWS and not checker.invoked
    assert r.details["windows"] == n and r.details["violations"] == n
    assert len(r.details["windows_shown"]) == MAX_WINDOW_ROWS
    assert r.details["windows_not_shown"] == n - MAX_WINDOW_ROWS
    assert len(r.counterexamples) <= 5
    # Every window's violation is itemised, shown or not, so a known-findings
    # file can cover them all (before, only the shown windows').
    assert len(r.details["violations_by_window"]) == n == r.details["violations"]
    assert "process_pause@replica-1#1" in r.details["violations_by_window"]


def test_stopping_faults_with_no_answer_naming_a_replica_are_unknown():
    """No answer named a replica (an external target's header placed
    nothing): every window would be "alone", so nothing was judged."""
    p = Plan()
    steady(p, 0, 20, node=None)
    p.fault(2, 14, target="replica-1")
    r = p.judge()
    assert r.valid == "unknown" and "no answer named" in r.details["why"], r.details


def test_with_a_deployment_s_own_header_unplaced_answers_in_a_window_are_unknown():
    p = Plan()
    steady(p, 0, 20, node="replica-0")
    steady(p, 7, 12, every=0.25, node=None)  # answers in the judged span naming no one
    p.fault(2, 14, target="replica-1")
    ops = [replace(o, index=i) for i, o in enumerate(sorted(p.ops, key=lambda o: o.time_ns))]
    provided = RunContext("t", provided={"node_attribution": "x-served-by"})
    r = FaultSLO().check(ops, provided)
    assert r.valid == "unknown" and "named no listed replica" in r.details["why"], r.details
    assert FaultSLO().check(ops, CTX).valid != "unknown"  # Ordeal's own: judged as before
