"""Property tests: the histogram's percentiles against a plain sorted list."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from invariants.histogram import LatencyHistogram

values = st.lists(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), min_size=1,
                  max_size=300)
quantiles = st.floats(min_value=0.0, max_value=1.0)


def exact(xs, q):
    return sorted(xs)[math.floor(q * (len(xs) - 1))]


@settings(max_examples=300, deadline=None)
@given(values, quantiles)
def test_quantile_within_relative_accuracy_of_nearest_rank(xs, q):
    h = LatencyHistogram(0.01).extend(xs)
    got, want = h.quantile(q), exact(xs, q)
    assert abs(got - want) <= 0.01 * want * 1.000001


@settings(max_examples=200, deadline=None)
@given(values, values, quantiles)
def test_merge_equals_recording_everything_in_one(a, b, q):
    merged = LatencyHistogram().extend(a).merge(LatencyHistogram().extend(b))
    single = LatencyHistogram().extend(a + b)
    assert merged.quantile(q) == single.quantile(q)
    assert merged.count == len(a) + len(b) and merged.buckets == single.buckets


@settings(deadline=None)  # Hypothesis' 200 ms per example flakes on a loaded machine
@given(values)
def test_extremes_are_exact(xs):
    h = LatencyHistogram().extend(xs)
    assert h.quantile(0) == min(xs) and h.quantile(1) == max(xs)


def test_memory_is_bounded_by_range_not_count():
    h = LatencyHistogram(0.01)
    for i in range(200_000):
        h.add(1 + (i % 10_000) * 0.37)  # 1 ms .. 3.7 s
    assert len(h.buckets) < 500
    assert LatencyHistogram().quantile(0.5) is None
