"""failover: a replica that stopped answering gets no new request after the
bound, and is taken back after its heal. Histories are planted op by op at
chosen times, with the value shapes the workload and the nemesis record;
the real runs' figures come from the suites (summary.json ``failover``)."""

from dataclasses import replace

from invariants import DEFAULT_CHECKERS, CheckerSettings, Failover, RunContext, SLOTargets
from invariants.failover import MAX_WINDOW_ROWS, victim_of
from ordeal.history.ops import NEMESIS, Op

CTX = RunContext(run_id="t")


class Plan:
    """Ops at chosen times (seconds): one request per process."""

    def __init__(self):
        self.ops: list[Op] = []
        self.proc = 0

    def _op(self, t, type, process, f, value, error=None):
        self.ops.append(Op(len(self.ops), int(t * 1e9), "2026-12-02T00:00:00.000Z", type,
                           process, f, value, error))

    def request(self, at, done, node="replica-0", type="ok", error=None):
        self.proc += 1
        self._op(at, "invoke", self.proc, "completions", {"seq": self.proc, "stream": True})
        self._op(done, type, self.proc, "completions",
                 {"seq": self.proc, "node": node}, error)

    def fault(self, at, healed, kind="process_pause", target="replica-1", error=None):
        v = {"kind": kind, "target": target}
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "begin"})
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "end"}, error)
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "begin"})
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "end"})

    def judge(self, **slo):
        ops = sorted(self.ops, key=lambda o: o.time_ns)
        ops = [replace(o, index=i) for i, o in enumerate(ops)]
        ctx = CTX if not slo else RunContext(run_id="t", settings=CheckerSettings(
            slo=replace(SLOTargets(), **slo)))
        return Failover().check(ops, ctx)


def steady(plan, start, end, every=0.5):
    """Requests the healthy replica answers, and after ``end`` both."""
    t = start
    while t < end:
        plan.request(t, t + 0.1, "replica-0")
        t += every


def test_a_router_that_ejects_fast_and_takes_back_is_valid_with_its_figures():
    p = Plan()
    steady(p, 0, 10)
    p.fault(2, 6)
    # Two requests went to the paused replica in its first second; it
    # answered them after the heal. Then the router sent elsewhere.
    p.request(2.3, 6.2, "replica-1")
    p.request(2.9, 6.3, "replica-1")
    p.request(7.0, 7.1, "replica-1")  # taken back 1 s after the heal
    r = p.judge()
    assert r.valid is True, r.counterexamples
    d = r.details
    assert d["windows"] == 1 and d["sent_after_bound"] == 0
    [w] = d["windows_shown"].values()
    assert w["sent_while_down"] == 2 and w["ejection_s"] == 0.9 and w["readmission_s"] == 1.0
    assert d["max_ejection_s"] == 0.9 and d["max_readmission_s"] == 1.0


def test_requests_sent_to_a_dead_replica_after_the_bound_are_caught():
    p = Plan()
    steady(p, 0, 14)
    p.fault(1, 12, kind="process_kill", target="replica-1")
    # A killed replica answers nothing: the router passes the refusal on.
    for at in (1.5, 3.0, 6.5, 7.5):
        p.request(at, at + 0.01, None, "fail", "HTTP 502: upstream connect error")
    p.request(12.5, 12.6, "replica-1")
    r = p.judge()
    assert r.valid is False
    assert r.details["sent_after_bound"] == 2 and r.details["max_ejection_s"] == 6.5
    assert [c["wall"] for c in r.counterexamples] and all(
        "after process_kill began (bound 5s)" in c["problem"] for c in r.counterexamples)
    # The same history under a looser bound (the SLO file's) is valid.
    assert p.judge(failover_bound_s=8.0).valid is True


def test_a_link_partition_names_its_replica_and_a_paused_one_answers_late():
    assert victim_of("router-replica-1") == "replica-1"
    assert victim_of("router-replica-0-grpc") == "replica-0"
    assert victim_of("replica-3") == "replica-3"
    assert victim_of("client-router") is None and victim_of("router") is None
    p = Plan()
    steady(p, 0, 20)
    p.fault(1, 11, kind="network_partition", target="router-replica-1")
    p.request(7.2, 11.5, "replica-1")  # waited out the cut: sent 6.2 s in
    p.request(12, 12.1, "replica-1")
    r = p.judge()
    assert r.valid is False and r.details["windows_shown"][
        "network_partition@router-replica-1#1"]["ejection_s"] == 6.2


def test_a_replica_never_taken_back_is_caught_only_with_enough_load_after():
    p = Plan()
    steady(p, 0, 50)
    p.fault(1, 5)
    r = p.judge()
    assert r.valid is False and r.details["not_readmitted"] == 1
    assert "was not taken back" in r.counterexamples[0]["problem"]
    short = Plan()
    steady(short, 0, 20)
    short.fault(1, 5)
    r = short.judge()
    assert r.valid is True and r.details["not_readmitted"] == 0
    [w] = r.details["windows_shown"].values()
    assert w["readmission_s"] is None


def test_other_faults_targets_and_failed_injects_are_not_judged():
    p = Plan()
    steady(p, 0, 10)
    p.fault(1, 3, kind="network_latency", target="router-replica-1")
    p.fault(4, 6, kind="process_kill", target="router")
    p.fault(6.5, 9, kind="process_pause", target="replica-1", error="no such process")
    p.request(8.8, 9.5, None, "info", "timeout")
    r = p.judge()
    assert r.valid is True and r.details["windows"] == 1
    [w] = r.details["windows_shown"].values()
    assert w["inject_failed"] is True and w["sent_while_down"] == 0


def test_in_flight_requests_are_not_sent_after_and_unplaced_oks_are_counted():
    p = Plan()
    steady(p, 0, 10)
    p.request(0.5, 8, None, "info", "connection lost")  # routed before the fault
    p.request(3, 3.1, None)  # an ok without a node cannot be placed
    p.fault(1, 7, kind="process_kill")
    r = p.judge()
    assert r.valid is True and r.details["unplaced"] == 1
    [w] = r.details["windows_shown"].values()
    assert w["sent_while_down"] == 0 and w["ejection_s"] == 0


def test_no_fault_is_valid_with_no_windows_and_memory_is_bounded():
    p = Plan()
    steady(p, 0, 5)
    assert p.judge().valid is True and p.judge().details["windows"] == 0
    many = Plan()
    for i in range(MAX_WINDOW_ROWS + 8):
        many.fault(i * 2, i * 2 + 1)
        many.request(i * 2 + 1.5, i * 2 + 1.6, "replica-1")
    r = many.judge()
    assert r.details["windows"] == MAX_WINDOW_ROWS + 8
    assert len(r.details["windows_shown"]) == MAX_WINDOW_ROWS
    assert r.details["windows_not_shown"] == 8


def test_every_window_s_violations_are_counted_by_window_shown_or_not():
    """A known-findings file matches failover's violations by window. On a
    long run most windows are no longer shown (the 72 h at x72 run: 50
    windows, 12 with violations, 20 of 31 by shown window): every window's
    violations must still be itemised, or no finding can cover them."""
    p = Plan()
    steady(p, 0, (MAX_WINDOW_ROWS + 8) * 20)
    for i in range(MAX_WINDOW_ROWS + 8):
        start = i * 20
        p.fault(start, start + 12)
        if i % 4 == 0:  # sent to the paused replica 6 and 7 s into the pause
            p.request(start + 6, start + 12.1, "replica-1")
            p.request(start + 7, start + 12.2, "replica-1")
        p.request(start + 13, start + 13.1, "replica-1")
    r = p.judge()
    d = r.details
    assert r.valid is False and d["windows_not_shown"] == 8
    assert d["violations"] == 2 * 10 == sum(d["violations_by_window"].values())
    assert len(d["violations_by_window"]) == 10
    assert "process_pause@replica-1#1" in d["violations_by_window"]  # the first, not shown
    assert "process_pause@replica-1#1" not in d["windows_shown"]


def test_result_mid_run_changes_nothing():
    """The endurance judge asks for a result at every interim file; a result
    must not add the shown windows' figures again (an interim of the 72 h
    at x72 run said 87 violations where the final pass found 31)."""
    p = Plan()
    steady(p, 0, 20)
    p.fault(2, 14)
    p.request(8.0, 14.1, "replica-1")
    ops = sorted(p.ops, key=lambda o: o.time_ns)
    checker = Failover()
    checker.start(CTX)
    for i, op in enumerate(ops):
        checker.feed(replace(op, index=i))
    first, again = checker.result(), checker.result()
    assert first.details["violations"] == again.details["violations"] == 1
    assert first.details["sent_after_bound"] == again.details["sent_after_bound"] == 1
    assert len(again.counterexamples) == 1


def test_failover_is_a_default_checker():
    assert Failover in DEFAULT_CHECKERS


def test_a_fault_on_the_only_replica_is_not_judged():
    p = Plan()
    t = 0.0
    while t < 40:
        p.request(t, t + 0.1, "replica-0" if not 1 <= t < 12 else None,
                  "ok" if not 1 <= t < 12 else "fail", None if not 1 <= t < 12 else "HTTP 502")
        t += 0.5
    p.fault(1, 12, kind="process_kill", target="replica-0")
    r = p.judge()
    assert r.valid is True and r.details["windows_on_the_only_replica"] == 1
    [w] = r.details["windows_shown"].values()
    assert w["no_other_replica"] is True and w["sent_while_down"] > 0
    assert w["sent_after_bound"] == 0 and r.details["violations"] == 0


def test_a_replica_an_external_target_names_its_own_way_is_a_victim():
    """Issue 47: the target file calls its replicas ``pod-a``/``pod-b``;
    with the names in the RunContext a fault on ``pod-b`` is a window, and
    a router that keeps sending there is caught (without them the window
    would not exist and failover would pass on nothing)."""
    assert victim_of("pod-b", ("pod-a", "pod-b")) == "pod-b"
    assert victim_of("router-pod-b", ("pod-a", "pod-b")) == "pod-b"
    assert victim_of("pod-b") is None and victim_of("router", ("pod-a",)) is None
    p = Plan()
    t = 0.0
    while t < 14:
        p.request(t, t + 0.1, "pod-a")
        t += 0.5
    p.fault(1, 12, kind="process_kill", target="pod-b")
    for at in (1.5, 7.5, 8.0):
        p.request(at, at + 0.01, None, "fail", "HTTP 502")
    ops = [replace(o, index=i) for i, o in enumerate(sorted(p.ops, key=lambda o: o.time_ns))]
    named = Failover().check(ops, RunContext(run_id="t", replicas=("pod-a", "pod-b")))
    assert named.valid is False and named.details["sent_after_bound"] == 2, named.details
    assert Failover().check(ops, CTX).details["windows"] == 0  # what the names prevent


def test_stopping_faults_with_no_answer_naming_a_replica_are_unknown():
    """A replica header whose values no replica claims places nothing: every
    window would look like one on the only replica; that is unknown, not a
    pass."""
    p = Plan()
    t = 0.0
    while t < 20:
        p.request(t, t + 0.1, None)
        t += 0.5
    p.fault(1, 12, kind="process_pause", target="replica-1")
    r = p.judge()
    assert r.valid == "unknown" and "no answer named" in r.details["why"], r.details
    assert r.details["unplaced"] > 30


def test_with_a_deployment_s_own_header_partial_placement_is_unknown():
    """An external target's replica_header (ctx.provided): a window whose
    victim no other listed replica answered beside (the file lists one of
    several), or answers in a window that name no listed replica, leave
    failover unknown; the same history on Ordeal's own cluster is judged."""
    provided = RunContext(run_id="t", replicas=("pod-a", "pod-b"),
                          provided={"node_attribution": "x-served-by"})
    p = Plan()
    t = 0.0
    while t < 20:
        p.request(t, t + 0.1, "pod-a" if t < 1 or t >= 12 else None)  # pod-c, unlisted
        t += 0.5
    p.fault(1, 12, kind="process_pause", target="pod-b")
    ops = [replace(o, index=i) for i, o in enumerate(sorted(p.ops, key=lambda o: o.time_ns))]
    r = Failover().check(ops, provided)
    assert r.valid == "unknown" and "named no listed replica" in r.details["why"], r.details
    own = Failover().check(ops, RunContext(run_id="t", replicas=("pod-a", "pod-b")))
    assert own.valid is True
    q = Plan()
    t = 0.0
    while t < 20:
        q.request(t, t + 0.1, "pod-b")  # only the victim is ever named
        t += 0.5
    q.fault(1, 12, kind="process_pause", target="pod-b")
    ops = [replace(o, index=i) for i, o in enumerate(sorted(q.ops, key=lambda o: o.time_ns))]
    r = Failover().check(ops, provided)
    assert r.valid == "unknown" and "no other named replica" in r.details["why"], r.details
