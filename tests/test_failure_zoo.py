"""The failure zoo's parts that need no cluster (issue 40): the toxics that
plant its shapes act as each shape says, the registry names a public report
and an invariant for every shape, and a zoo record says caught only when
the verdict failed on an invariant the shape names. The shapes against the
real cluster: suites/test_zoo.py -m zoo."""

from __future__ import annotations

import json
import re

import pytest

from faults.proxy.sse import SseEvent
from faults.proxy.toxics import ToxicError, build_toxic
from faults.proxy.toxics.l7 import ResponseContext
from faults.zoo import SHAPES
from invariants import DEFAULT_CHECKERS
from runs.zoo import append_record, judge_shape, read_records, table


def chunk(i, text="tok", finish=None, usage=None):
    body = {"id": "c", "choices": [{"index": 0, "text": text, "token_ids": [i],
                                    "finish_reason": finish}], "usage": usage}
    return SseEvent.of_data(json.dumps(body), i)


def run_stream(toxic, events):
    ctx = ResponseContext([toxic])
    out = []
    for ev in events:
        if ctx.finish_early:
            break
        out.extend(toxic.on_event(ctx, ev))
    return out, ctx


def stream(n=5):
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
    return [chunk(i) for i in range(n)] + [SseEvent.of_data(json.dumps(
        {"id": "c", "choices": [], "usage": usage}), n), SseEvent.of_data("[DONE]")]


def test_sse_cut_ends_the_stream_with_no_finish_reason_and_no_done():
    toxic = build_toxic({"type": "sse_cut", "attributes": {"after_events": 2}})
    out, ctx = run_stream(toxic, stream())
    assert [e.index for e in out] == [0, 1] and ctx.finish_early
    assert not any(e.done for e in out)


def test_sse_cut_fabricate_ends_it_with_a_made_up_stop_and_done_and_no_usage():
    toxic = build_toxic({"type": "sse_cut", "attributes": {"after_events": 2,
                                                           "fabricate": True}})
    out, _ = run_stream(toxic, stream())
    assert [e.index for e in out[:2]] == [0, 1] and out[-1].done
    last = json.loads(out[2].data)
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["text"] == ""
    assert "token_ids" not in last["choices"][0] and last["usage"] is None
    with pytest.raises(ToxicError, match="fabricate"):
        build_toxic({"type": "sse_cut", "attributes": {"fabricate": "yes"}})


def test_sse_rewrite_usage_changes_the_count_and_not_the_tokens():
    toxic = build_toxic({"type": "sse_rewrite_usage", "attributes": {"delta": 1}})
    events = stream(4)
    out, _ = run_stream(toxic, events)
    assert [e.data for e in out[:4]] == [e.data for e in events[:4]]  # tokens untouched
    usage = json.loads(out[4].data)["usage"]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_every_shape_names_a_public_report_and_invariants_the_default_verdict_has():
    default = {c.name for c in DEFAULT_CHECKERS}
    assert len(SHAPES) >= 6
    for name, shape in SHAPES.items():
        assert shape.sources and all(re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", s)
                                     for s in shape.sources), (name, shape.sources)
        assert set(shape.caught_by) <= default, (name, shape.caught_by)
        assert shape.how and shape.title and callable(shape.plant)


class _Shape:
    name, title, how = "usage_mismatch", "usage differs", "proxy"
    sources, caught_by = ("vllm-project/vllm#8625",), ("usage_matches_tokens",)


def summary(verdict, *invariants):
    return {"run_id": "r1", "verdict": verdict, "ops": {"ok": 10}, "invariants": [
        {"name": n, "valid": v, "counterexamples": c, **extra} for n, v, c, extra in invariants]}


def test_a_record_says_caught_only_for_a_fail_on_an_invariant_the_shape_names(tmp_path):
    history = tmp_path / "history.jsonl"
    history.write_text("\n".join(json.dumps({"index": i, "time_ns": 1_000_000_000 * i})
                                 for i in range(10)) + "\n")
    caught = judge_shape(_Shape, summary("fail", ("usage_matches_tokens", False,
                                                  [{"index": 7}, {"index": 9}], {})),
                         history, 5_000_000_000, {"hits": 3})
    assert caught["caught"] and caught["caught_by"] == ["usage_matches_tokens"]
    assert caught["first_caught_s"] == 2.0
    # failed, but on another invariant: not caught (the right checker missed it)
    other = judge_shape(_Shape, summary("fail", ("goodput", False, [], {})), history, 0, {})
    assert not other["caught"] and other["failed"] == ["goodput"]
    # a known finding is not a catch; a pass is not
    known = judge_shape(_Shape, summary("pass", ("usage_matches_tokens", False, [],
                                                 {"known": [{"invariant": "x"}]})),
                        history, 0, {})
    assert not known["caught"] and known["failed"] == []
    clean = judge_shape(None, summary("pass", ("goodput", True, [], {})), history, None, {})
    assert clean["caught"] is None and clean["false_positive"] is False
    dirty = judge_shape(None, summary("fail", ("goodput", False, [], {})), history, None, {})
    assert dirty["false_positive"] is True
    for r in (caught, other, clean):
        append_record(tmp_path, r)
    text = table(read_records(tmp_path / "zoo-results.jsonl"))
    assert "MISSED (failed: goodput)" in text  # the last record of the shape wins
    assert "Caught 0 of 1 shapes; clean run: 0 false positives" in text


def test_every_nth_picks_one_response_in_n_whatever_the_connection():
    """Toxicity picks connections (Toxiproxy's meaning), so a client with a
    few pooled connections gets a toxic on all or none of them: the zoo's
    first greedy_diverges run at toxicity 0.2 changed 0 responses. every_nth
    picks responses."""
    toxic = build_toxic({"type": "sse_rewrite_text",
                         "attributes": {"after_events": 0, "text": "X", "every_nth": 3}})
    changed = []
    for _ in range(9):
        out, _ = run_stream(toxic, [chunk(0, "cat"), chunk(1, "dog")])
        changed.append(json.loads(out[0].data)["choices"][0]["text"] == "X")
    assert changed == [True, False, False] * 3
    with pytest.raises(ToxicError, match="every_nth"):
        build_toxic({"type": "sse_cut", "attributes": {"every_nth": 0}})


def shape_of_this_commit() -> str:
    """One shape per CI run, from the commit (a failure replays with the same
    choice), or ``ORDEAL_ZOO_SHAPE``; every shape: suites/test_zoo.py -m zoo."""
    import os

    from long_rotation import head_commit

    names = sorted(SHAPES)
    chosen = os.environ.get("ORDEAL_ZOO_SHAPE")
    if chosen:
        if chosen not in SHAPES:
            raise pytest.UsageError(f"ORDEAL_ZOO_SHAPE={chosen!r}: use one of {names}")
        return chosen
    commit = head_commit()
    return names[int(commit[:8], 16) % len(names)] if commit else names[0]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_this_commit_s_zoo_shape_is_caught_on_the_shared_cluster(ordeal_run, ordeal_config,
                                                                 ordeal_cluster, ordeal_say):
    """The zoo in every CI, as far as its budget goes: one shape, planted in
    the tests' shared real cluster, must fail the default verdict on one of
    the invariants it names (the suite's own check, runs/zoo.py)."""
    from load.spec import WorkloadSpec
    from runs.zoo import LOAD_S, run_shape, shape_problems

    shape = SHAPES[shape_of_this_commit()]
    spec = WorkloadSpec(duration_s=LOAD_S, rate=ordeal_config.load_rate, seed=ordeal_config.seed)
    record, _ = run_shape(ordeal_run, ordeal_cluster, shape, spec, ordeal_say)
    problems = shape_problems(shape, record)
    assert not problems, problems[0]
