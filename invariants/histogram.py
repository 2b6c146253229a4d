"""A bounded, mergeable latency histogram with a guaranteed relative error.

Logarithmic buckets in the manner of DDSketch (and of HdrHistogram's
significant-digit buckets): a value v > 0 goes to bucket ceil(log_g(v)) with
g = (1+a)/(1-a), and a quantile is answered with the bucket's centre, which is
within relative error ``a`` of the exact nearest-rank quantile. Memory depends
on the range of values (about 1,100 buckets from 1 us to 1 h at a = 1%), never
on how many were recorded, so a 72-hour run costs what a 1-minute run does.
Two histograms merge by adding counts: per-window figures roll up exactly.
"""

from __future__ import annotations

import math
from typing import Iterable

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


class LatencyHistogram:
    def __init__(self, relative_accuracy: float = 0.01):
        if not 0 < relative_accuracy < 1:
            raise ValueError("relative_accuracy must be within (0, 1)")
        self.alpha = relative_accuracy
        self.gamma = (1 + relative_accuracy) / (1 - relative_accuracy)
        self._log_gamma = math.log(self.gamma)
        self.buckets: dict[int, int] = {}
        self.zeros = 0  # values <= 0 (a clock that did not move)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if value <= 0:
            self.zeros += 1
            return
        key = math.ceil(math.log(value) / self._log_gamma)
        self.buckets[key] = self.buckets.get(key, 0) + 1

    def extend(self, values: Iterable[float]) -> "LatencyHistogram":
        """Many values at once: the hot path for inter-token latencies."""
        vals = list(values)
        if not vals:
            return self
        self.count += len(vals)
        self.total += sum(vals)
        self.min = min(self.min, min(vals))
        self.max = max(self.max, max(vals))
        buckets, log, ceil, lg = self.buckets, math.log, math.ceil, self._log_gamma
        for v in vals:
            if v <= 0:
                self.zeros += 1
            else:
                key = ceil(log(v) / lg)
                buckets[key] = buckets.get(key, 0) + 1
        return self

    def merge(self, other: "LatencyHistogram") -> "LatencyHistogram":
        if other.alpha != self.alpha:
            raise ValueError("cannot merge histograms of different accuracy")
        for k, c in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + c
        self.zeros += other.zeros
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        return self

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile (the value at rank floor(q * (n - 1)) of the
        sorted values), within relative error ``alpha``; clamped to the
        observed min and max so p0 and p100 are exact."""
        if self.count == 0:
            return None
        if not 0 <= q <= 1:
            raise ValueError("q must be within [0, 1]")
        rank = math.floor(q * (self.count - 1))
        if rank == 0:
            return self.min
        if rank == self.count - 1:
            return self.max
        if rank < self.zeros:
            return max(self.min, 0.0) if self.min <= 0 else self.min
        seen = self.zeros
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen > rank:
                centre = 2 * self.gamma ** key / (self.gamma + 1)
                return min(max(centre, self.min), self.max)
        return self.max

    def summary(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"count": self.count}
        if self.count:
            out["mean"] = round(self.total / self.count, 3)
            out["min"] = round(self.min, 3)
            out["max"] = round(self.max, 3)
        for p in PERCENTILES:
            v = self.quantile(p / 100)
            out[f"p{p:g}"] = None if v is None else round(v, 3)
        return out
