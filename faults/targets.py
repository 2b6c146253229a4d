"""Target selection, pure: which nodes (or links) a fault hits.

Jepsen's vocabulary: ``one``, ``minority``, ``majority``, ``all``; or an
explicit comma-separated list of names. Seeded, so a schedule replays.
"""

from __future__ import annotations

import random
from typing import Sequence

from .base import FaultError

MODES = ("one", "minority", "majority", "all")


def select(spec: str, names: Sequence[str], rng: random.Random) -> list[str]:
    """Pick targets from ``names`` (in their given order) by ``spec``.

    minority = the largest set that is less than half (at least one);
    majority = the smallest set that is more than half.
    """
    pool = list(names)
    if not pool:
        raise FaultError(f"target {spec!r}: there is nothing to choose from")
    n = len(pool)
    if spec == "all":
        return pool
    if spec in ("one", "minority", "majority"):
        k = {"one": 1, "minority": max(1, (n - 1) // 2), "majority": n // 2 + 1}[spec]
        chosen = set(rng.sample(pool, k))
        return [x for x in pool if x in chosen]
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in pool]
    if unknown or not wanted:
        raise FaultError(f"target {spec!r}: unknown name(s) {unknown or [spec]}; choose one of "
                         f"{', '.join(MODES)} or names from {pool}")
    return wanted
