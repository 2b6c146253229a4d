"""lsn_jump: a sequence jumps in flight (a repeat); the stack or the
checkers must catch it, and only while it is injected.

On vLLM events of token streams are duplicated on the way to the client.
Through vllm-router 0.1.17 chunks carry no running token count (it drops
``continuous_usage_stats``), so the duplicate shows as streamed token ids
that no longer add up to the usage the server reported. On Triton a step of
a correlated sequence repeats on the way to the server, which must reject
it (``sequence_consistent`` counts it as a detected jump). The engine's
adapter says which evidence counts (``lsn_jump_evidence``)."""

from datetime import datetime

import pytest

from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def when(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_duplicated_stream_events_are_caught_and_stop_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "lsn_jump", "client-router",
                         {"mode": "duplicate", "after_events": 2})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    after = r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    caught = ordeal_run.engine.lsn_jump_evidence(r.summary["invariants"])
    assert caught, r.summary["invariants"]
    # Every catch is a request that met the fault: it ended after the
    # inject and at most one request timeout after the heal.
    start, end = when(r.window["injected"]), when(r.window["healed"])
    for c in caught:
        assert start - 1 <= when(c["wall"]) <= end + 20, (c, r.window)
    assert after.requests >= 10 and after.ok_share == 1.0, r.brief()
