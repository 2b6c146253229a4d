"""Every checker catches a planted violation and passes a clean history."""

from invariants import NoSilentLoss, RunContext, StreamWellFormed, merge_valid, run_checker
from ordeal.history.ops import Op

CTX = RunContext(run_id="t")


def ops(*specs):
    """(type, process, value) tuples -> Ops with increasing indexes."""
    out = []
    for i, (t, p, v) in enumerate(specs):
        out.append(Op(index=i, time_ns=i * 1000, wall="2026-01-01T00:00:00.000Z", type=t,
                      process=p, f="completions", value=v or {}))
    return out


def good_stream(**over):
    s = {"ids": ["cmpl-1"], "finish_reasons": ["length"], "done": True, "after_done": 0,
         "errors": [], "malformed": []}
    s.update(over)
    return {"stream": s}


# -- no silent loss -------------------------------------------------------

def test_complete_history_is_valid():
    h = ops(("invoke", 1, None), ("invoke", 2, None), ("ok", 2, None), ("info", 1, None),
            ("info", "nemesis", {"kind": "process_kill"}))
    r = NoSilentLoss().check(h, CTX)
    assert r.valid is True and r.details["invoked"] == 2 and r.details["completed"] == 2


def test_missing_completion_is_caught():
    h = ops(("invoke", 1, None), ("invoke", 2, None), ("ok", 1, None))
    r = NoSilentLoss().check(h, CTX)
    assert r.valid is False
    assert r.details["never_completed"] == 1
    assert r.counterexamples[0]["process"] == 2 and r.counterexamples[0]["index"] == 1


def test_completion_without_invoke_and_reinvoke_while_open_are_caught():
    r = NoSilentLoss().check(ops(("ok", 5, None)), CTX)
    assert r.valid is False and r.details["completion_without_invoke"] == 1
    r = NoSilentLoss().check(ops(("invoke", 1, None), ("invoke", 1, None), ("ok", 1, None)), CTX)
    assert r.valid is False and r.details["invoke_while_open"] == 1


def test_no_requests_is_unknown_not_a_pass():
    assert NoSilentLoss().check([], CTX).valid == "unknown"


# -- stream well-formed ---------------------------------------------------

def test_well_formed_streams_are_valid():
    h = ops(("invoke", 1, None), ("ok", 1, good_stream()),
            ("invoke", 2, None), ("info", 2, good_stream(done=False, finish_reasons=[])))
    r = StreamWellFormed().check(h, CTX)
    assert r.valid is True and r.details["ok_streams"] == 1


def test_two_finish_reasons_are_caught():
    h = ops(("invoke", 1, None), ("ok", 1, good_stream(finish_reasons=["length", "stop"])))
    r = StreamWellFormed().check(h, CTX)
    assert r.valid is False
    assert "exactly one finish_reason" in r.counterexamples[0]["problems"][0]


def test_each_malformation_is_caught():
    for bad in (dict(ids=["a", "b"]), dict(ids=[]), dict(done=False), dict(after_done=2),
                dict(errors=['{"message": "boom"}']), dict(finish_reasons=[])):
        h = ops(("invoke", 1, None), ("ok", 1, good_stream(**bad)))
        assert StreamWellFormed().check(h, CTX).valid is False, bad


def test_mid_stream_error_recorded_as_fail_is_counted_not_flagged():
    h = ops(("invoke", 1, None), ("ok", 1, good_stream()),
            ("invoke", 2, None), ("fail", 2, good_stream(errors=["boom"], done=False)))
    r = StreamWellFormed().check(h, CTX)
    assert r.valid is True and r.details["mid_stream_errors"] == 1


def test_malformed_line_is_a_violation_even_in_a_failed_op():
    h = ops(("invoke", 1, None), ("ok", 1, good_stream()),
            ("invoke", 2, None), ("fail", 2, good_stream(malformed=["data is not JSON"])))
    assert StreamWellFormed().check(h, CTX).valid is False


def test_a_stream_the_server_closed_in_good_order_without_done_is_a_violation():
    """Failure zoo, stream_cut_without_done: the body ended in good order
    (``clean_eof``) with no [DONE] and no finish_reason. The client keeps the
    op as info; the checker judges it whatever its type. A stream lost to a
    transport error (no ``clean_eof``) stays the client's indeterminate op."""
    cut = good_stream(done=False, finish_reasons=[], clean_eof=True)
    h = ops(("invoke", 1, None), ("ok", 1, good_stream()), ("invoke", 2, None), ("info", 2, cut))
    r = StreamWellFormed().check(h, CTX)
    assert r.valid is False and r.details["cut_without_done"] == 1
    assert "without [DONE] and without a finish_reason" in r.counterexamples[0]["problems"][0]
    lost = good_stream(done=False, finish_reasons=[])
    h = ops(("invoke", 1, None), ("ok", 1, good_stream()), ("invoke", 2, None), ("info", 2, lost))
    assert StreamWellFormed().check(h, CTX).valid is True


# -- combining and containment -------------------------------------------

def test_merge_ranks_false_over_unknown_over_true():
    assert merge_valid([True, True]) is True
    assert merge_valid([True, "unknown"]) == "unknown"
    assert merge_valid(["unknown", False, True]) is False


def test_a_crashing_checker_gives_unknown_with_the_error():
    class Broken:
        name = "broken"

        def check(self, history, ctx):
            raise ZeroDivisionError("oops")

    r = run_checker(Broken(), [], CTX)
    assert r.valid == "unknown" and "ZeroDivisionError: oops" in r.details["error"]


def test_one_pass_gives_the_same_results_and_contains_a_crash():
    from invariants.base import StreamingChecker, check_all

    class Explodes(StreamingChecker):
        name = "explodes"

        def feed(self, op):
            if op.index == 2:
                raise KeyError("boom")

        def result(self):
            raise AssertionError("never reached")

    h = ops(("invoke", 1, None), ("ok", 1, good_stream()), ("invoke", 2, None),
            ("ok", 2, good_stream(finish_reasons=[])))
    results = check_all([NoSilentLoss(), Explodes(), StreamWellFormed()], iter(h), CTX)
    assert [r.name for r in results] == ["no_silent_loss", "explodes", "stream_wellformed"]
    assert results[0].to_dict() == NoSilentLoss().check(h, CTX).to_dict()
    assert results[2].to_dict() == StreamWellFormed().check(h, CTX).to_dict()
    assert results[1].valid == "unknown" and "KeyError" in results[1].details["error"]
