"""fault_effective: a fault that did nothing makes the run unknown, with the
reason. Histories are planted op by op with the shapes the nemesis records
(the heal/end op carries the fault's observation, ``effect``); the real
observations of each kind are tested where the kind is (test_kernel_faults,
test_link_faults, test_process_faults, test_gpu_faults) and a whole run with
a fault that does nothing in test_fault_effective_run."""

from datetime import datetime, timedelta, timezone

from invariants import DEFAULT_CHECKERS, FaultEffective, RunContext
from invariants.fault_effective import clock_threshold_s
from ordeal.history.ops import MONITOR, NEMESIS, Op
from reports.summary import verdict_of

CTX = RunContext(run_id="t")
T0 = datetime(2026, 12, 2, tzinfo=timezone.utc)


def wall(t: float) -> str:
    return (T0 + timedelta(seconds=t)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Plan:
    def __init__(self):
        self.ops: list[Op] = []
        self.proc = 0

    def _op(self, t, type, process, f, value, error=None):
        self.ops.append(Op(len(self.ops), int(t * 1e9), wall(t), type, process, f, value, error))

    def fault(self, at, healed, kind="network_partition", target="replica-1", effect=None,
              inject_error=None, inject_value=None):
        v = {"kind": kind, "target": target}
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "begin"})
        self._op(at + 0.01, "info", NEMESIS, "inject",
                 {**v, **(inject_value or {}), "phase": "end"}, inject_error)
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "begin"})
        end = {**v, "phase": "end"}
        if effect is not None:
            end["effect"] = effect
        self._op(healed + 0.01, "info", NEMESIS, "heal", end)

    def answer(self, at, done, node, created=None):
        self.proc += 1
        self._op(at, "invoke", self.proc, "completions", {"seq": self.proc})
        value = {"seq": self.proc, "node": node}
        if created is not None:
            value["created"] = created
        self._op(done, "ok", self.proc, "completions", value)

    def judge(self):
        return FaultEffective().check(sorted(self.ops, key=lambda o: o.time_ns), CTX)


def seen(effective, **evidence):
    return {"effective": effective, "how": "planted", "evidence": evidence}


def epoch(t: float) -> int:
    return int((T0 + timedelta(seconds=t)).timestamp())


def test_faults_that_acted_are_valid_with_counts_per_kind():
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, kind="process_kill", effect=seen(True, port="refused"))
    r = p.judge()
    assert r.valid is True, r.details
    assert r.details["windows"] == 2 and r.details["effective"] == 2
    assert r.details["by_kind"]["process_kill"]["effective"] == 1


def test_a_partition_that_matched_no_packet_makes_the_run_unknown_with_the_reason():
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, target="nobody", effect=seen(False, packets_matched=0))
    r = p.judge()
    assert r.valid == "unknown"
    assert r.details["no_effect"] == 1 and r.details["effective"] == 1
    assert "showed no effect" in r.details["why"]
    [ex] = r.counterexamples
    assert ex["target"] == "nobody" and ex["evidence"] == {"packets_matched": 0}
    assert "network_partition on nobody showed no effect" in ex["problem"]
    assert verdict_of([True, r.valid]) == "unknown"


def test_an_observation_that_failed_is_unknown_not_a_pass():
    p = Plan()
    p.fault(1, 5, effect={"effective": None, "how": "the observation failed",
                          "error": "ProxyUnreachable: refused"})
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    assert "ProxyUnreachable" in r.counterexamples[0]["problem"]


def test_windows_that_cannot_be_judged_are_counted_not_passed_silently():
    p = Plan()
    p.fault(1, 3, kind="ray_node_loss")  # no observation recorded
    p.fault(4, 5, inject_error="FaultError: no such node")  # never went in: not a window here
    p._op(6, "info", NEMESIS, "inject", {"kind": "process_pause", "target": "replica-0",
                                         "phase": "begin"})
    p._op(6.1, "info", NEMESIS, "inject", {"kind": "process_pause", "target": "replica-0",
                                           "phase": "end"})
    p._op(7, "info", MONITOR, "gap", {})  # the harness died in the window
    r = p.judge()
    assert r.valid is True
    assert r.details["windows"] == 2
    assert r.details["not_observable"] == 1 and r.details["not_judged"] == 1


def test_clock_drift_is_judged_from_the_answers_created_stamps():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 3600,
                                                     "takes_effect_within_s": 2})
    p.answer(1.5, 1.6, "replica-1", created=epoch(1.5))  # before it took effect: not counted
    p.answer(4, 4.2, "replica-1", created=epoch(4) + 3600)
    p.answer(5, 5.2, "replica-0", created=epoch(5))  # another node
    r = p.judge()
    assert r.valid is True and r.details["effective"] == 1, r.counterexamples


def test_a_clock_that_did_not_move_is_caught():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 3600,
                                                     "takes_effect_within_s": 2})
    for t in (4, 5, 6):
        p.answer(t, t + 0.1, "replica-1", created=epoch(t))
    p.answer(10.5, 10.6, "replica-1", created=epoch(10.5) + 3600)  # after the heal began
    r = p.judge()
    assert r.valid == "unknown" and r.details["no_effect"] == 1
    assert r.counterexamples[0]["evidence"]["answers"] == 3


def test_a_clock_fault_whose_target_answered_nothing_is_unobserved():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 60})
    p.answer(4, 4.1, "replica-0", created=epoch(4))
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    assert "no answer of replica-1" in r.counterexamples[0]["problem"]


def test_the_clock_threshold_follows_the_offset_within_the_stamps_resolution():
    assert clock_threshold_s(3600) == 2.0
    assert clock_threshold_s(3) == 1.5
    assert clock_threshold_s(0.5) == 1.0
    assert clock_threshold_s(None) == 2.0


def test_a_run_without_faults_has_nothing_to_prove_and_it_is_a_default_checker():
    assert FaultEffective in DEFAULT_CHECKERS
    p = Plan()
    p.answer(1, 1.1, "replica-0")
    r = p.judge()
    assert r.valid is True and r.details["windows"] == 0


def test_memory_is_bounded_by_what_is_open_not_run_length():
    p = Plan()
    for i in range(300):
        t = 10 * i
        p.fault(t + 1, t + 5, effect=seen(i % 2 == 0, packets_matched=i % 2 * 7))
        p.fault(t + 2, t + 6, kind="clock_drift", inject_value={"offset_s": 3600})
        p.answer(t + 4.5, t + 4.6, "replica-1", created=epoch(t + 4.5) + 3600)
    checker = FaultEffective()
    r = checker.check(sorted(p.ops, key=lambda o: o.time_ns), CTX)
    assert not checker.clocks and not checker.invoked and len(checker.examples) <= 5
    assert r.details["windows"] == 600 and r.details["no_effect"] == 150
    assert r.details["by_kind"]["clock_drift"]["effective"] == 300
