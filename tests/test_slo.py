"""SLO checkers: clean histories pass, planted violations are caught, and
figures are split into steady state, fault windows and after-heal windows."""

import pytest

from invariants import RunContext
from invariants.settings import CheckerSettings, SLOTargets
from invariants.slo import Availability, ErrorRate, Goodput, LatencySLO, Recovery, RestartReadiness
from ordeal.config import ConfigError
from ordeal.history.ops import Op

S = 1_000_000_000  # ns


class H:
    """Builds a history with explicit times (seconds)."""

    def __init__(self):
        self.ops = []
        self.proc = 0

    def _op(self, t, type, process, f, value=None, error=None):
        self.ops.append(Op(len(self.ops), int(t * S), "w", type, process, f, value or {}, error))

    def req(self, t, dur=0.1, type="ok", ttft=50.0, tpot=5.0, e2e=None, itl=(5.0, 5.0)):
        self.proc += 1
        self._op(t, "invoke", self.proc, "completions")
        value = {} if type != "ok" else {"ttft_ms": ttft, "tpot_ms": tpot,
                                          "e2e_ms": e2e if e2e is not None else dur * 1000,
                                          "itl_ms": list(itl)}
        self.ops.append(Op(len(self.ops), int((t + dur) * S), "w", type, self.proc,
                           "completions", value, None if type == "ok" else "boom"))

    def fault(self, t_inject, t_heal_end, ready_after=None, heal_error=None,
              kind="process_kill", target="replica-1"):
        v = {"kind": kind, "target": target}
        self._op(t_inject, "info", "nemesis", "inject", {**v, "phase": "begin"})
        self._op(t_inject + 0.01, "info", "nemesis", "inject", {**v, "phase": "end"})
        self._op(t_heal_end - 0.5, "info", "nemesis", "heal", {**v, "phase": "begin"})
        end = {**v, "phase": "end"}
        if ready_after is not None:
            end.update(restarted=True, ready_after_s=ready_after)
        self._op(t_heal_end, "info", "nemesis", "heal", end, heal_error)

    def sorted(self):
        return sorted(self.ops, key=lambda o: o.time_ns)


def ctx(**kw):
    return RunContext(settings=CheckerSettings(slo=SLOTargets(**kw)))


def run_with_fault(bad_after_heal_until=None):
    h = H()
    for i in range(100):
        h.req(i * 0.1)  # steady, 0-10 s
    h.fault(10, 20, ready_after=9.5)
    for i in range(100):  # during the fault: a third fail
        h.req(10 + i * 0.1, type="fail" if i % 3 == 0 else "ok")
    for i in range(200):  # after the heal, 20-40 s
        t = 20.05 + i * 0.1
        slow = bad_after_heal_until is not None and t < bad_after_heal_until
        h.req(t, ttft=5000.0 if slow else 50.0)
    return h.sorted()


def test_clean_run_with_a_fault_passes_every_slo_checker():
    hist = run_with_fault()
    c = ctx()
    for checker in (LatencySLO(), Goodput(), ErrorRate(), Availability(), Recovery(),
                    RestartReadiness()):
        r = checker.check(hist, c)
        assert r.valid is True, (checker.name, r.details)


def test_figures_are_split_by_phase():
    r = ErrorRate().check(run_with_fault(), ctx())
    w = r.details["windows"]
    assert w["steady"]["requests"] == 100 and w["steady"]["error_rate"] == 0
    fault = w["process_kill@replica-1#1"]
    assert fault["phase"] == "fault" and fault["requests"] == 100 and fault["fail"] == 34
    assert w["after_heal:process_kill@replica-1#1"]["requests"] == 200


def test_latency_percentiles_are_vllm_definitions_of_each_metric():
    r = LatencySLO().check(run_with_fault(), ctx())
    steady = r.details["windows"]["steady"]
    assert steady["ttft_ms"]["p99"] == pytest.approx(50, rel=0.01)
    assert steady["itl_ms"]["count"] == 200  # every gap of every stream
    assert steady["e2e_ms"]["p50"] == pytest.approx(100, rel=0.01)


def test_planted_slow_steady_state_is_caught():
    h = H()
    for i in range(100):
        h.req(i * 0.1, ttft=3000.0 if i % 10 == 0 else 50.0)  # 10% over 2 s
    r = LatencySLO().check(h.sorted(), ctx())
    assert r.valid is False and "ttft_ms" in r.details["breaches"]
    g = Goodput().check(h.sorted(), ctx())
    assert g.valid is False and g.details["windows"]["steady"]["goodput"] == 0.9
    assert g.counterexamples


def test_planted_steady_errors_are_caught():
    h = H()
    for i in range(100):
        h.req(i * 0.1, type="info" if i < 5 else "ok")
    r = ErrorRate().check(h.sorted(), ctx())
    assert r.valid is False and r.details["windows"]["steady"]["error_rate"] == 0.05


def test_planted_outage_during_a_fault_is_caught():
    h = H()
    h.req(0)
    h.fault(1, 5)
    for i in range(20):
        h.req(1.1 + i * 0.1, type="fail" if i < 15 else "ok")
    r = Availability().check(h.sorted(), ctx())
    assert r.valid is False and r.details["below"] == ["process_kill@replica-1#1"]


def test_an_outage_of_the_entrypoint_is_shown_not_judged_a_replica_s_still_is():
    """A reset of the client's only link fails every request whatever the
    cluster does: shown, not judged. The same outage on a replica, in the
    same run, still fails availability."""
    h = H()
    h.req(0)
    h.fault(1, 5, kind="connection_reset", target="client-router")
    for i in range(20):
        h.req(1.1 + i * 0.1, type="info")
    r = Availability().check(h.sorted(), ctx())
    assert r.valid is True, r
    assert r.details["not_judged"]["windows"] == ["connection_reset@client-router#1"]
    h.fault(6, 10)
    for i in range(20):
        h.req(6.1 + i * 0.1, type="fail" if i < 15 else "ok")
    r = Availability().check(h.sorted(), ctx())
    assert r.valid is False and r.details["below"] == ["process_kill@replica-1#1"], r


def test_slow_recovery_is_caught_and_timed():
    r = Recovery().check(run_with_fault(bad_after_heal_until=35), ctx(recovery_bound_s=10))
    w = r.details["windows"]["process_kill@replica-1#1"]
    assert r.valid is False and w["recovered"] is False and 14 < w["recovery_s"] < 16
    # The counterexample names the window and the request that missed last, and why:
    # a failed invariant with nothing to show would leave its reader guessing.
    [c] = r.counterexamples
    assert c["window"] == "process_kill@replica-1#1" and c["recovery_s"] == w["recovery_s"]
    assert c["miss"] and c["index"] == w["last_miss"]["index"], c
    assert "bound 10s" in c["problem"], c
    r = Recovery().check(run_with_fault(bad_after_heal_until=25), ctx(recovery_bound_s=10))
    w = r.details["windows"]["process_kill@replica-1#1"]
    assert r.valid is True and 4 < w["recovery_s"] < 6


def test_no_traffic_after_heal_is_unknown_and_unhealed_is_false():
    h = H()
    h.req(0)
    h.fault(1, 5)
    assert Recovery().check(h.sorted(), ctx()).valid == "unknown"
    h2 = H()
    h2.req(0)
    h2._op(1, "info", "nemesis", "inject", {"kind": "process_kill", "target": "r",
                                            "phase": "begin"})
    r = Recovery().check(h2.sorted(), ctx())
    assert r.valid is False and r.counterexamples[0]["problem"].endswith("never healed")


def test_a_heal_inside_another_fault_is_judged_by_the_requests_after_both():
    """A restart that ends while a co-tenant still holds memory: every
    request after it falls in the co-tenant's window, then in the
    co-tenant's after-heal. Those after both heals judge both windows'
    recovery (a miss there counts for each); before, the first window was
    left ``unknown`` for want of its own after-heal requests."""
    def run(slow_until):
        h = H()
        h.req(0)
        h.fault(1, 10, kind="process_kill", target="replica-1")
        v = {"kind": "gpu_memory_pressure", "target": "replica-0"}
        h._op(5, "info", "nemesis", "inject", {**v, "phase": "begin"})
        h._op(5.01, "info", "nemesis", "inject", {**v, "phase": "end"})
        h.req(10.2, type="fail")  # the co-tenant's, not the restart's
        h._op(11, "info", "nemesis", "heal", {**v, "phase": "begin"})
        h._op(11.5, "info", "nemesis", "heal", {**v, "phase": "end"})
        for i in range(40):
            t = 11.6 + i * 0.5
            h.req(t, ttft=5000.0 if t < slow_until else 50.0)
        return Recovery().check(h.sorted(), ctx(recovery_bound_s=5, after_heal_s=30))
    r = run(0)
    kill, held = (r.details["windows"][w] for w in ("process_kill@replica-1#1",
                                                   "gpu_memory_pressure@replica-0#1"))
    assert r.valid is True and kill["requests_after_heal"] == held["requests_after_heal"] == 40
    assert kill["recovery_s"] == held["recovery_s"] == 0.0, r.details
    r = run(20)  # the last slow one ends at 19.7 s: 9.7 s after one heal, 8.2 after the other
    kill, held = (r.details["windows"][w] for w in ("process_kill@replica-1#1",
                                                   "gpu_memory_pressure@replica-0#1"))
    assert r.valid is False and kill["recovered"] is held["recovered"] is False, r.details
    assert (kill["recovery_s"], held["recovery_s"]) == (9.7, 8.2), r.details


def test_slow_or_failed_restart_is_caught():
    h = H()
    h.fault(1, 300, ready_after=299)
    assert RestartReadiness().check(h.sorted(), ctx()).valid is False
    h = H()
    h.fault(1, 5, heal_error="NodeNotReady: replica-1 is not ready")
    r = RestartReadiness().check(h.sorted(), ctx())
    assert r.valid is False and "NodeNotReady" in r.counterexamples[0]["error"]
    r0 = RestartReadiness().check([], ctx())
    assert r0.valid is True and "no node was restarted" in r0.details["why"]


def test_a_restart_that_met_a_full_device_names_vllm_s_reason_and_the_fault_in_place():
    """A replica killed and restarted while a co-tenant holds GPU memory:
    the failed restart's counterexample says vLLM's own out-of-memory line
    (process_kill records it as ``restart_failed``) and which fault was in
    place then; a restart that failed without a reason in its log says so."""
    h = H()
    pressure = {"kind": "gpu_memory_pressure", "target": "replica-0"}
    h._op(1, "info", "nemesis", "inject", {**pressure, "phase": "begin"})
    h._op(1.1, "info", "nemesis", "inject", {**pressure, "phase": "end"})
    reason = ("out of memory: ValueError: Free memory on device cuda:0 (20.1/79.2 GiB) on "
              "startup is less than desired GPU memory utilization (0.35, 27.7 GiB).")
    kill = {"kind": "process_kill", "target": "replica-1"}
    h._op(2, "info", "nemesis", "inject", {**kill, "phase": "begin"})
    h._op(2.1, "info", "nemesis", "inject", {**kill, "phase": "end"})
    h._op(5, "info", "nemesis", "heal", {**kill, "phase": "begin"})
    h._op(30, "info", "nemesis", "heal",
          {**kill, "phase": "end", "restarted": False,
           "restart_failed": {"reason": reason, "after_s": 24.0, "state": "exited"}},
          "FaultError: restart failed: NodeNotReady: replica-1 is not ready")
    h._op(31, "info", "nemesis", "heal", {**pressure, "phase": "begin"})
    h._op(31.5, "info", "nemesis", "heal", {**pressure, "phase": "end"})
    r = RestartReadiness().check(h.sorted(), ctx())
    assert r.valid is False, r.to_dict()
    [c] = r.counterexamples
    assert c["problem"] == f"replica-1 did not serve again after its restart: {reason}", c
    assert c["while"] == ["gpu_memory_pressure on replica-0"], c
    h = H()
    h.fault(1, 5, heal_error="FaultError: restart failed: NodeNotReady: timed out")
    [c] = RestartReadiness().check(h.sorted(), ctx()).counterexamples
    assert c["problem"].startswith("replica-1 did not serve again after its restart: no reason "
                                   "in its log: FaultError"), c
    assert "while" not in c, c  # the killed node's own window is not "another fault"


def test_slo_file(tmp_path):
    f = tmp_path / "slo.toml"
    f.write_text("[slo]\nttft_ms = 800\nmin_goodput = 0.99\n")
    t = SLOTargets.from_file(f)
    assert t.ttft_ms == 800 and t.min_goodput == 0.99 and t.e2e_ms == SLOTargets().e2e_ms
    f.write_text("[slo]\nttft = 800\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['ttft'\]"):
        SLOTargets.from_file(f)
    f.write_text("[slo\n")
    with pytest.raises(ConfigError, match="cannot read it as TOML"):
        SLOTargets.from_file(f)


def test_a_run_without_faults_is_not_unknown_for_fault_checkers():
    h = H()
    for i in range(10):
        h.req(i)
    for checker in (Availability(), Recovery(), RestartReadiness()):
        r = checker.check(h.sorted(), ctx())
        assert r.valid is True and r.details["why"].startswith("no "), r.to_dict()
    # ... but a fault window with no request in it cannot be judged.
    h.fault(20, 30)
    assert Availability().check(h.sorted(), ctx()).valid == "unknown"


def test_latency_histograms_are_bounded_however_many_windows_a_run_has():
    """A 72-hour run has thousands of fault windows; per-window latency
    histograms past the latest MAX_LATENCY_WINDOWS are merged into one
    "earlier-windows" group, so memory does not grow with the run."""
    from invariants.slo import _Groups

    h = H()
    n_windows = 100
    for i in range(n_windows):
        t = 10.0 + i * 100
        h.req(t - 5)
        h.fault(t, t + 10)
        h.req(t + 2, ttft=500.0)  # in the fault window
        h.req(t + 20)  # after the heal
    c = LatencySLO()
    r = c.check(h.sorted(), RunContext("t"))
    keep = _Groups.MAX_LATENCY_WINDOWS
    with_hist = [k for k, g in c.groups.groups.items() if g["hist"]]
    assert len(with_hist) <= keep + 3, len(with_hist)  # + steady + the two aggregates
    earlier = r.details["windows"]["earlier-windows"]
    # Every fault-window request's TTFT is still somewhere: the aggregate
    # holds the folded ones, the kept windows the rest.
    fault_ttft = sum(w["ttft_ms"]["count"] for k, w in r.details["windows"].items()
                     if w["phase"] == "fault" and "ttft_ms" in w)
    assert fault_ttft == n_windows and earlier["ttft_ms"]["count"] > 0
    folded = [w for w in r.details["windows"].values() if w.get("latency_in")]
    assert folded and all("ttft_ms" not in w and w["requests"] for w in folded)


def test_slo_file_drift_and_harness_tables(tmp_path):
    from invariants.settings import CheckerSettings, settings_from_file

    f = tmp_path / "slo.toml"
    f.write_text("[slo]\nttft_ms = 800\n[drift]\nrss_mb_per_h = 25\nmin_span_h = 2\n"
                 "[harness]\nmax_schedule_lag_ms = 250\n")
    kw = settings_from_file(f)
    assert kw == {"drift_rss_mb_per_h": 25.0, "drift_min_span_h": 2.0,
                  "max_schedule_lag_ms": 250.0}
    s = CheckerSettings(**kw)
    assert s.drift_bounds()["rss_mb"] == 25.0 and s.drift_bounds()["fds"] == 2.0
    assert SLOTargets.from_file(f).ttft_ms == 800  # the tables live side by side
    assert settings_from_file(tmp_path / "slo.toml") and not settings_from_file(
        _write(tmp_path / "plain.toml", "ttft_ms = 900\n"))
    for text, match in (("[drift]\nrss = 3\n", r"\[drift\]: unknown key\(s\) \['rss'\]"),
                        ("[drift]\nfds_per_h = -1\n", "fds_per_h = -1; give a number >= 0"),
                        ("[harness]\nmax_schedule_lag_ms = 'x'\n", "give a number"),
                        ("drift = 3\n[slo]\n", "drift must be a table")):
        f.write_text(text)
        with pytest.raises(ConfigError, match=match):
            settings_from_file(f)


def _write(path, text):
    path.write_text(text)
    return path


def test_an_entrypoint_that_only_slows_is_still_judged():
    h = H()
    h.req(0)
    h.fault(1, 5, kind="network_latency", target="client-router")
    for i in range(20):
        h.req(1.1 + i * 0.1, type="fail" if i < 15 else "ok")
    r = Availability().check(h.sorted(), ctx())
    assert r.valid is False and r.details["below"] == ["network_latency@client-router#1"], r
