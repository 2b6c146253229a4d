"""Checks the harness-fault tests (issue 11) share: a history read back
through its CRC-32C chunks is whole, ordered, and loses no request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ordeal.history.ops import HARNESS, Op
from ordeal.history.reader import read_history

LATENCY_KEYS = ("ttft_ms", "e2e_ms", "tpot_ms", "itl_ms", "itl_max_ms")


def read_intact(path: Path) -> list[Op]:
    """Every op of a closed history, read through ``read_history`` (each
    chunk's CRC-32C verified). Fails on any complaint of the reader, on a gap
    or disorder in the indexes, and on a monotonic clock going backwards."""
    problems: list[str] = []
    ops = list(read_history(path, on_error=problems.append))
    assert not problems, problems
    assert ops, f"{path}: no op"
    assert [op.index for op in ops] == list(range(len(ops))), "indexes have a gap or disorder"
    back = [(a.index, b.index) for a, b in zip(ops, ops[1:]) if b.time_ns < a.time_ns]
    assert not back, f"time_ns went backwards between ops {back[:5]}"
    return ops


def pair_requests(ops: list[Op]) -> list[tuple[Op, Op]]:
    """(invoke, completion) for every client request; fails if an invoke has
    no completion (ok, fail or info), or a completion no invoke."""
    open_: dict[Any, Op] = {}
    pairs: list[tuple[Op, Op]] = []
    for op in ops:
        if op.process in HARNESS:
            continue
        if op.type == "invoke":
            assert op.process not in open_, f"two invokes open on process {op.process}: {op}"
            open_[op.process] = op
        else:
            inv = open_.pop(op.process, None)
            assert inv is not None, f"completion without an invoke: {op}"
            pairs.append((inv, op))
    assert not open_, f"{len(open_)} invoke(s) never completed: {list(open_.values())[:3]}"
    return pairs


def negative_durations(ops: list[Op]) -> list[str]:
    """Every latency figure below zero, as 'index key=value'."""
    bad = []
    for op in ops:
        for key in LATENCY_KEYS:
            v = op.value.get(key)
            if isinstance(v, (int, float)) and v < 0:
                bad.append(f"{op.index} {key}={v}")
            elif isinstance(v, dict):  # summaries of a list: min/max/...
                bad += [f"{op.index} {key}.{k}={x}" for k, x in v.items()
                        if isinstance(x, (int, float)) and x < 0]
            elif isinstance(v, list):
                bad += [f"{op.index} {key}[]={x}" for x in v
                        if isinstance(x, (int, float)) and x < 0]
    return bad
