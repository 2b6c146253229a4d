from invariants import CheckerSettings, RunContext
from invariants.determinism import CanaryDeterminism
from invariants.usage import UsageMatchesTokens
from ordeal.history.ops import Op


def hist(*pairs):
    ops = []
    for p, (inv, done_type, done) in enumerate(pairs):
        ops.append(Op(len(ops), len(ops), "w", "invoke", p, "completions", inv))
        ops.append(Op(len(ops), len(ops), "w", done_type, p, "completions", done))
    return ops


def ok_stream(billed, streamed, max_tokens=8, reason="length", chunks=None):
    stream = {"n_token_ids": streamed,
              "chunks": chunks if chunks is not None else [{"text": "a"}] * (streamed or 1)}
    return ({"max_tokens": max_tokens}, "ok",
            {"usage": {"completion_tokens": billed}, "finish_reason": reason, "stream": stream})


def test_usage_clean_and_planted():
    c = RunContext()
    assert UsageMatchesTokens().check(hist(ok_stream(8, 8)), c).valid is True
    r = UsageMatchesTokens().check(hist(ok_stream(8, 8), ok_stream(8, 7)), c)
    assert r.valid is False and "streamed 7 token ids but usage says 8" in r.counterexamples[0]["problem"]
    r = UsageMatchesTokens().check(hist(ok_stream(9, 9, max_tokens=8)), c)
    assert r.valid is False and "> max_tokens" in r.counterexamples[0]["problem"]
    r = UsageMatchesTokens().check(hist(ok_stream(5, 5, max_tokens=8, reason="length")), c)
    assert r.valid is False and "finish_reason 'length'" in r.counterexamples[0]["problem"]


def test_usage_without_token_ids_is_bounded_and_says_so():
    c = RunContext()
    merged = ok_stream(8, None, chunks=[{"text": "ab"}] * 6)  # chunks merged under load
    r = UsageMatchesTokens().check(hist(merged), c)
    assert r.valid is True and "without token ids" in r.details["exactness"]
    too_many = ok_stream(8, None, chunks=[{"text": "a"}] * 9)
    assert UsageMatchesTokens().check(hist(too_many), c).valid is False


def test_a_stream_without_usage_among_streams_with_it_is_caught_and_asked_twice_the_same():
    """Failure zoo, truncation_looks_complete: a proxy ends a cut stream
    with its own finish_reason "stop" and [DONE], and no usage chunk. In a
    run where the stack gives usage, that stream is a violation; a stack
    that never gives usage stays unknown."""
    c = RunContext()
    unbilled = ({"max_tokens": 8}, "ok", {"usage": None, "finish_reason": "stop",
                                          "stream": {"n_token_ids": 2}})
    checker = UsageMatchesTokens()
    r = checker.check(hist(ok_stream(8, 8), unbilled), c)
    assert r.valid is False and r.details["streams_without_usage"] == 1
    assert r.counterexamples[0]["problem"].startswith("the stream asked for usage")
    again = checker.result()  # interim results ask again: the same answer, nothing doubled
    assert again.details["violations"] == 1 and len(again.counterexamples) == 1
    assert UsageMatchesTokens().check(hist(unbilled, unbilled), c).valid == "unknown"
    unstreamed = ({"max_tokens": 8}, "ok", {"usage": None, "finish_reason": "stop"})
    assert UsageMatchesTokens().check(hist(ok_stream(8, 8), unstreamed), c).valid is True


def canary(prompt, text, ids=None):
    return ({"canary": True, "prompt": prompt}, "ok", {"text": text, "token_ids": ids})


def test_canaries_match_the_golden_answer():
    c = RunContext()
    h = hist(canary("p", "abc"), canary("q", "xyz"), canary("p", "abc"), canary("q", "xyz"))
    r = CanaryDeterminism().check(h, c)
    assert r.valid is True and r.details["matched"] == 2 and r.details["tolerance"] == "exact text"


def test_a_drifting_canary_is_caught_and_the_prefix_tolerance_is_stated():
    h = hist(canary("p", "abc", [1, 2, 3]), canary("p", "abd", [1, 2, 4]))
    r = CanaryDeterminism().check(h, RunContext())
    assert r.valid is False and r.counterexamples[0]["golden"] == "abc"
    def prefix(k: int) -> RunContext:
        return RunContext(settings=CheckerSettings(determinism_prefix_tokens=k))

    r = CanaryDeterminism().check(h, prefix(2))
    assert r.valid is True and r.details["tolerance"] == "first 2 token ids"
    r = CanaryDeterminism().check(h, prefix(3))
    assert r.valid is False
    assert CanaryDeterminism().check(hist(canary("p", "a")), RunContext()).valid == "unknown"
