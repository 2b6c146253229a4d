"""Monitor-sample checkers: planted lies, resets and leaks are caught."""

import pytest

from invariants import CountersMonotonic, HealthTruthful, LeakBound, NodesServeAtEnd, RunContext
from load.metrics import MetricsParseError, parse_metrics
from ordeal.history.ops import Op

S = 1_000_000_000


def sample(t, node="replica-0", pid=10, health=200, running=0, waiting=0, tokens=0.0,
           success=0.0, rss_mb=1000, kv=0.0, f="sample"):
    metrics = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
               "vllm:generation_tokens_total": tokens, "vllm:request_success_total": success,
               "vllm:kv_cache_usage_perc": kv}
    return Op(0, int(t * S), "w", "info", "monitor", f,
              {"node": node, "pid": pid, "health": health, "metrics": metrics,
               "rss_bytes": rss_mb * 2**20})


def test_healthy_busy_node_making_tokens_is_truthful():
    h = [sample(t, running=2, tokens=t * 100) for t in range(0, 30, 2)]
    assert HealthTruthful().check(h, RunContext()).valid is True


def test_health_200_with_stuck_work_is_a_lie():
    h = [sample(t, running=2, tokens=500.0) for t in range(0, 30, 2)]
    r = HealthTruthful().check(h, RunContext())
    assert r.valid is False and "no token for" in r.counterexamples[0]["problem"]
    # Not a lie when /health says so, or when nothing is queued.
    assert HealthTruthful().check([sample(t, health=503, running=2, tokens=5.0)
                                   for t in range(0, 30, 2)], RunContext()).valid is True
    assert HealthTruthful().check([sample(t, tokens=5.0) for t in range(0, 30, 2)],
                                  RunContext()).valid is True


def served(t, node="replica-0", begun=(), ended=()):
    return Op(0, int(t * S), "w", "info", "monitor", "served",
              {"node": node, "begun": list(begun),
               "entries": [[rid, 200, True] for rid in ended]})


def test_frozen_gauges_do_not_hide_work_the_journal_says_is_held():
    """A paused engine freezes its own gauges (here at 0 running); the API
    server still took the requests, and its journal says so."""
    h = [served(1, begun=["a", "b"])] + [sample(t, tokens=500.0) for t in range(2, 30, 2)]
    r = HealthTruthful().check(h, RunContext())
    assert r.valid is False and "no token for" in r.counterexamples[0]["problem"]
    # Once the held requests end, the idle node is truthful again ...
    h = [served(1, begun=["a"]), served(3, ended=["a"])] + [sample(t, tokens=5.0)
                                                             for t in range(4, 30, 2)]
    assert HealthTruthful().check(h, RunContext()).valid is True
    # ... and a restarted node holds none of the requests of the old process.
    h = [sample(0, tokens=5.0), served(1, begun=["a"])] + [
        sample(t, pid=11, tokens=0.0) for t in range(2, 30, 2)]
    assert HealthTruthful().check(h, RunContext()).valid is True


def test_counter_going_backwards_is_caught_unless_the_node_restarted():
    ok = [sample(0, tokens=100.0), sample(2, tokens=10.0, pid=11), sample(4, tokens=20.0, pid=11)]
    r = CountersMonotonic().check(ok, RunContext())
    assert r.valid is True and r.details["restarts_seen"] == 1
    # A restart whose pid the monitor has not learned yet (a Ray actor
    # restarted by Ray) still shows in the process start time it exports.
    moved = [sample(0, tokens=100.0), sample(2, tokens=10.0)]
    moved[0].value["metrics"]["process_start_time_seconds"] = 1000.0
    moved[1].value["metrics"]["process_start_time_seconds"] = 1090.0
    r = CountersMonotonic().check(moved, RunContext())
    assert r.valid is True and r.details["restarts_seen"] == 1
    moved[1].value["metrics"]["process_start_time_seconds"] = 1000.0  # same process: a lie
    assert CountersMonotonic().check(moved, RunContext()).valid is False
    bad = [sample(0, tokens=100.0), sample(2, tokens=90.0)]
    r = CountersMonotonic().check(bad, RunContext())
    assert r.valid is False and "generation_tokens_total went from 100.0 to 90.0" in \
        r.counterexamples[0]["problem"]


def test_leak_after_drain_is_caught():
    clean = [sample(0, rss_mb=1000), sample(10, rss_mb=1200), sample(20, rss_mb=1100, f="drain")]
    assert LeakBound().check(clean, RunContext()).valid is True
    leak = [sample(0, rss_mb=1000), sample(20, rss_mb=2500, f="drain")]
    r = LeakBound().check(leak, RunContext())
    assert r.valid is False and "RSS 2500 MB after drain" in r.counterexamples[0]["problem"]
    stuck = [sample(0), sample(20, running=1, kv=0.3, f="drain")]
    r = LeakBound().check(stuck, RunContext())
    assert r.valid is False and len(r.counterexamples) == 2
    # A restarted node is compared with its own new baseline.
    restarted = [sample(0, rss_mb=500), sample(5, pid=11, rss_mb=1000),
                 sample(20, pid=11, rss_mb=1100, f="drain")]
    assert LeakBound().check(restarted, RunContext()).valid is True
    assert LeakBound().check([sample(0)], RunContext()).valid == "unknown"


def test_a_leak_inside_the_factor_bound_is_caught_by_its_second_half_growth():
    """The planted leak of faults/zoo/memory_leak.py as the monitor saw it
    (2934 MB at the start, 3697 MB drained 28 s later: under 1.5 x + 256 MB)
    against a warm-up that grows early and then stays (the clean runs)."""
    leak = [sample(t, rss_mb=2934 + int(t * 27)) for t in range(0, 28)] + [
        sample(28, rss_mb=3697, f="drain")]
    r = LeakBound().check(leak, RunContext())
    assert r.valid is False, r.details
    [problem] = r.counterexamples
    assert "replica-0 RSS grew 3" in problem["problem"] and "second half (14 s" in (
        problem["problem"]), problem
    assert r.details["nodes"]["replica-0"]["limit_mb"] > 3697  # the factor bound let it pass
    warm = [sample(t, rss_mb=2934 + min(t, 10) * 15) for t in range(0, 28)] + [
        sample(28, rss_mb=3090, f="drain")]
    r = LeakBound().check(warm, RunContext())
    assert r.valid is True and r.details["nodes"]["replica-0"]["second_half_growth_mb"] == 6
    # A second half over leak_half_max_s is left to drift: not judged here.
    slow = [sample(t * 600, rss_mb=1000 + t * 50) for t in range(0, 14)] + [
        sample(8400, rss_mb=1700, f="drain")]
    r = LeakBound().check(slow, RunContext())
    assert r.valid is True and r.details["nodes"]["replica-0"]["second_half_growth_mb"] is None
    # Memory bounded: a long run keeps a thinned series, its first sample and its newest.
    checker = LeakBound()
    checker.start(RunContext())
    for t in range(5000):
        checker.feed(sample(t, rss_mb=1000))
    assert len(checker.series["replica-0"]) <= LeakBound.MAX_KEPT
    assert checker.series["replica-0"][0][0] == 0


def nemesis(t, f, target="replica-1", **value):
    return Op(0, int(t * S), "w", "info", "nemesis", f,
              {"kind": "process_kill", "target": target, "phase": "end", **value})


def test_a_node_that_does_not_serve_at_the_end_fails_unless_a_fault_left_it_down():
    up = [sample(0), sample(0, node="replica-1"), sample(20, f="drain"),
          sample(20, node="replica-1", f="drain")]
    assert NodesServeAtEnd().check(up, RunContext()).valid is True
    # A replica that died on its own, behind a router that failed over.
    dead = up[:3] + [Op(0, 20 * S, "w", "info", "monitor", "drain",
                        {"node": "replica-1", "pid": 11, "health": None, "exit_code": -9,
                         "error": "/health: ConnectionRefusedError"})]
    r = NodesServeAtEnd().check(dead, RunContext())
    assert r.valid is False and r.counterexamples[0]["node"] == "replica-1"
    assert "exited with code -9" in r.counterexamples[0]["problem"]
    # Killed on purpose, without a restart: named, not a finding ...
    left = [nemesis(5, "inject"), nemesis(7, "heal", restarted=False), *dead]
    r = NodesServeAtEnd().check(left, RunContext())
    assert r.valid is True and "left_down_by" in r.details["nodes"]["replica-1"]
    # ... but a heal that did restart it, or did not because it still ran, is no excuse.
    for heal in ({"restarted": True}, {"restarted": False, "why": "the node still runs"}):
        again = [nemesis(5, "inject"), nemesis(7, "heal", **heal), *dead]
        assert NodesServeAtEnd().check(again, RunContext()).valid is False, heal
    # A fault on it still in at the end (never healed) holds it down.
    held = [nemesis(5, "inject"), *dead]
    assert NodesServeAtEnd().check(held, RunContext()).valid is True
    # A later fault on the node left down finds it down: its "already healed"
    # heal, or a heal that failed, does not take the exemption back.
    later = [nemesis(5, "inject"), nemesis(7, "heal", restarted=False),
             nemesis(9, "heal", already_healed=True),
             Op(0, 10 * S, "w", "info", "nemesis", "heal",
                {"kind": "process_kill", "target": "replica-1", "phase": "end"},
                "FaultError: replica-1 is not running"), *dead]
    assert NodesServeAtEnd().check(later, RunContext()).valid is True
    # Two faults on the node, one healed: the other still holds it down.
    two = [nemesis(5, "inject"), nemesis(6, "inject"), nemesis(7, "heal", restarted=True),
           *dead]
    assert NodesServeAtEnd().check(two, RunContext()).valid is True
    # A fault the dead harness left in was healed at the resume (the gap):
    # a crash after it is a finding.
    gap = Op(0, 10 * S, "w", "info", "monitor", "gap", {"down_s": 3.0})
    assert NodesServeAtEnd().check([nemesis(5, "inject"), gap, *dead],
                                   RunContext()).valid is False
    # No drain round (the run stopped early): could not see.
    assert NodesServeAtEnd().check(up[:2], RunContext()).valid == "unknown"


def test_metrics_parser_sums_labels_and_rejects_garbage():
    text = ('# TYPE vllm:request_success counter\n'
            'vllm:request_success_total{finished_reason="length"} 3\n'
            'vllm:request_success_total{finished_reason="stop"} 2\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n'
            'other_metric 7\n')
    assert parse_metrics(text) == {"vllm:request_success_total": 5.0,
                                   "vllm:num_requests_running": 1.0}
    with pytest.raises(MetricsParseError):
        parse_metrics("vllm:num_requests_running one two three\n")
