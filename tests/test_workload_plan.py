import statistics

import pytest

from load.plan import plan_requests
from load.spec import WorkloadSpec
from ordeal.config import ConfigError


def take(spec, limit):
    return list(plan_requests(spec, limit_s=limit))


def test_same_seed_same_plan_other_seed_other_plan():
    a = take(WorkloadSpec(seed=1), 20)
    assert a == take(WorkloadSpec(seed=1), 20)
    assert a != take(WorkloadSpec(seed=2), 20)


def test_poisson_arrivals_have_the_asked_rate():
    plan = take(WorkloadSpec(rate=50.0, seed=3), 200)
    assert 50 * 200 * 0.95 < len(plan) < 50 * 200 * 1.05
    gaps = [b.at_s - a.at_s for a, b in zip(plan, plan[1:])]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.9 < cv < 1.1  # exponential gaps: coefficient of variation 1


def test_burstiness_changes_the_spread_not_the_rate():
    bursty = take(WorkloadSpec(rate=50.0, burstiness=0.25, seed=3), 200)
    steady = take(WorkloadSpec(rate=50.0, burstiness=4.0, seed=3), 200)
    for plan in (bursty, steady):
        assert 50 * 200 * 0.9 < len(plan) < 50 * 200 * 1.1
    cv = lambda p: statistics.pstdev([b.at_s - a.at_s for a, b in zip(p, p[1:])]) / statistics.mean(  # noqa: E731
        [b.at_s - a.at_s for a, b in zip(p, p[1:])])
    assert cv(bursty) > 1.6 and cv(steady) < 0.6  # 1/sqrt(shape): 2 and 0.5


def test_canaries_are_greedy_streamed_one_per_block_and_reach_every_round_robin_replica():
    plan = take(WorkloadSpec(rate=10, canary_every=5, seed=0), 2)  # 20 requests
    canaries = [r for r in plan if r.canary]
    assert [r.seq for r in canaries] == [0, 6, 12, 18]  # block j: j*5 + j%5
    assert all(r.temperature == 0.0 and r.stream for r in canaries)
    # Behind a round-robin router of N replicas, canary seq % N is the replica:
    # a fixed stride of 10 gave one replica every canary of 2 (failure zoo).
    seqs = [r.seq for r in take(WorkloadSpec(rate=10, canary_every=10, seed=0), 20)
            if r.canary]  # 200 requests
    assert len(seqs) >= 15
    for n in (2, 3, 4, 5):
        assert {s % n for s in seqs} == set(range(n)), n


def test_ranges_and_shares_are_respected():
    plan = take(WorkloadSpec(rate=100, prompt_words=(2, 3), max_tokens=(5, 6), stream_share=0.0,
                             chat_share=1.0, canary_every=0, seed=0), 10)
    assert all(2 <= len(r.prompt.split()) <= 3 and 5 <= r.max_tokens <= 6 for r in plan)
    assert all(r.endpoint == "chat" and not r.stream for r in plan)
    assert plan[0].body("m")["messages"][0]["content"] == plan[0].prompt


@pytest.mark.parametrize("bad, match", [
    (dict(rate=0), "rate"), (dict(burstiness=0), "burstiness"), (dict(duration_s=-1), "duration"),
    (dict(max_tokens=(5, 2)), "max_tokens"), (dict(stream_share=2), "stream_share"),
    (dict(mode="sideways"), "mode"),
])
def test_bad_specs_say_what_is_wrong(bad, match):
    with pytest.raises(ConfigError, match=match):
        WorkloadSpec(**bad)
