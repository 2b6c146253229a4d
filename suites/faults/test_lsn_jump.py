"""lsn_jump: a sequence jumps in flight (a repeat); the stack or the
checkers must catch it, and only while it is injected.

On vLLM events of token streams are duplicated on the way to the client.
Through vllm-router 0.1.17 chunks carry no running token count (it drops
``continuous_usage_stats``), so the duplicate shows as streamed token ids
that no longer add up to the usage the server reported. On Triton a step of
a correlated sequence repeats on the way to the server, which must reject
it (``sequence_consistent`` counts it as a detected jump). The engine's
adapter says which evidence counts (``lsn_jump_evidence``). Every catch the
checkers list (up to five each) was sent before the heal ended, and the same
checkers run over the requests sent after the heal alone find no jump.
The run's verdict (``assert_verdict``) judges the jump as planted corruption
(invariants/planted.py): it must be detected, and nothing else may break."""

from datetime import datetime
from pathlib import Path

import pytest

from invariants.base import RunContext, check_all
from ordeal.history.ops import HARNESS, Op
from ordeal.history.reader import read_history
from runs.single_fault import run_single_fault

pytestmark = [pytest.mark.faults, pytest.mark.cluster]


def when(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def invoke_walls(history: Path, indexes: set[int]) -> dict[int, str]:
    """For each completion op index: the wall time its request was sent
    (the invoke of the same process just before it), from the history."""
    last: dict[object, str] = {}
    out: dict[int, str] = {}
    for op in read_history(history):
        if op.type == "invoke":
            last[op.process] = op.wall
        elif op.index in indexes:
            out[op.index] = last[op.process]
    return out


def sent_after(history: Path, t: float) -> list[Op]:
    """The client's requests sent after ``t`` (invoke and completion), in
    history order: a history of the after-heal traffic alone."""
    keep: set[object] = set()
    out: list[Op] = []
    for op in read_history(history):
        if op.process in HARNESS:
            continue
        if op.type == "invoke":
            if when(op.wall) > t:
                keep.add(op.process)
                out.append(op)
            else:
                keep.discard(op.process)
        elif op.process in keep:
            out.append(op)
            keep.discard(op.process)
    return out


def test_duplicated_stream_events_are_caught_and_stop_after_heal(ordeal_run):
    r = run_single_fault(ordeal_run, "lsn_jump", "client-router",
                         {"mode": "duplicate", "after_events": 2})
    assert r.effect["took_effect"], r.effect  # seen in the system's state
    after = r.phases["after_heal"]
    assert r.window.get("injected") and r.window.get("healed"), r.window
    # The run's verdict judges the jump as planted (detection required, the
    # rest of the history judged as usual); the catches themselves are what
    # the engine's checkers say of the whole history, planted or not.
    raw = check_all(ordeal_run.engine.checkers(), read_history(ordeal_run.run_dir.history_path),
                    RunContext(run_id="raw", settings=ordeal_run.checker_settings))
    caught = ordeal_run.engine.lsn_jump_evidence([j.to_dict() for j in raw])
    assert caught, [j.to_dict() for j in raw]
    # Every catch is a request that met the fault: sent before the heal
    # ended and answered after the inject. A request sent after the heal
    # (the after-heal window) is never caught: the jump stopped with it.
    start, end = when(r.window["injected"]), when(r.window["healed"])
    placed = [c for c in caught if isinstance(c.get("index"), int)]
    assert placed, caught  # the catches name their ops in the history
    sent = invoke_walls(ordeal_run.run_dir.history_path, {c["index"] for c in placed})
    for c in placed:
        assert when(c["wall"]) >= start - 1, (c, r.window)
        assert when(sent[c["index"]]) <= end, (c, sent[c["index"]], r.window)
    assert after.requests >= 10 and after.ok_share == 1.0, r.brief()
    # Not only the listed catches: the engine's own checkers, run over the
    # requests sent after the heal alone, catch no jump there (a jump that
    # outlived the heal would show here however many came before it).
    later = sent_after(ordeal_run.run_dir.history_path, end)
    assert sum(op.type == "invoke" for op in later) >= 10, len(later)
    judged = check_all(ordeal_run.engine.checkers(), later,
                       RunContext(run_id="after-heal", settings=ordeal_run.checker_settings))
    left = ordeal_run.engine.lsn_jump_evidence([j.to_dict() for j in judged])
    assert not left, left
    r.assert_verdict()  # the whole verdict, known findings applied
