from load.sse import SSEParser, StreamRecorder


def events(parser, *chunks):
    out = []
    for c in chunks:
        out.extend(parser.feed(c))
    out.extend(parser.close())
    return out


def test_events_split_anywhere_across_chunks():
    raw = b'data: {"a": 1}\n\n: keep-alive\n\nevent: error\ndata: x\ndata: y\r\n\r\ndata: [DONE]\n\n'
    for cut in range(len(raw)):
        evs = events(SSEParser(), raw[:cut], raw[cut:])
        assert [(e.event, e.data) for e in evs] == [
            ("message", '{"a": 1}'), ("error", "x\ny"), ("message", "[DONE]")], cut


def test_final_event_without_blank_line_still_counts():
    assert [e.data for e in events(SSEParser(), b"data: last")] == ["last"]


def test_invalid_utf8_and_unknown_fields_are_recorded():
    p = SSEParser()
    evs = events(p, b"data: \xff\xfe\n\nbogus: 1\n\n")
    assert len(evs) == 1 and "\ufffd" in evs[0].data
    assert any("invalid UTF-8" in x for x in p.problems)
    assert any("unknown SSE field" in x for x in p.problems)


def test_over_long_line_is_skipped_with_bounded_memory():
    p = SSEParser(max_line=1000)
    evs = list(p.feed(b"data: " + b"x" * 5000))
    evs += list(p.feed(b"y" * 5000 + b"\n\ndata: ok\n\n"))
    assert [e.data for e in evs] == ["ok"]
    assert len(p._buf) < 1000 and any("longer than 1000" in x for x in p.problems)


def recorded(*lines):
    rec = StreamRecorder(start_ns=0)
    p = SSEParser()
    t = 0
    for line in lines:
        for ev in p.feed(line.encode() + b"\n\n"):
            t += 1_000_000
            rec.on_event(ev, t)
    rec.add_problems(p.problems)
    return rec.record


def test_recorder_keeps_ids_text_finish_usage_and_timing():
    r = recorded(
        'data: {"id":"c1","choices":[{"text":"he","finish_reason":null}]}',
        'data: {"id":"c1","choices":[{"delta":{"content":"llo"},"finish_reason":"length"}]}',
        'data: {"id":"c1","choices":[],"usage":{"completion_tokens":2},"system_fingerprint":"fp"}',
        "data: [DONE]")
    assert r.ids == ["c1"] and r.text == "hello" and r.finish_reasons == ["length"]
    assert r.done and r.usage == {"completion_tokens": 2} and r.system_fingerprint == "fp"
    assert r.token_times_ns == [1_000_000, 2_000_000] and r.text_parts == ["he", "llo"]


def test_recorder_catches_error_events_malformed_data_and_bytes_after_done():
    r = recorded('data: {"error": {"message": "engine died", "code": 500}}',
                 "event: error\ndata: upstream reset",
                 "data: {not json",
                 "data: [DONE]",
                 'data: {"id":"late"}')
    assert len(r.errors) == 2 and "engine died" in r.errors[0]
    assert r.malformed and "not JSON" in r.malformed[0]
    assert r.done and r.after_done == 1


def _chunk(seq, ids):
    import json
    return ("data: " + json.dumps({"id": "c1", "choices": [{"text": "x", "token_ids": ids,
                                                           "finish_reason": None}],
                                   "usage": {"completion_tokens": seq}}) + "\n\n").encode()


def _record(*chunks):
    rec = StreamRecorder(0)
    for ev in events(SSEParser(), *chunks, b"data: [DONE]\n\n"):
        rec.on_event(ev, 1)
    return rec.record


def test_a_clean_sequence_has_no_problems_even_with_merged_chunks():
    assert _record(_chunk(1, [5]), _chunk(3, [6, 7]), _chunk(4, [8])).sequence_problems == []


def test_lost_duplicated_and_reordered_events_are_named():
    assert "gap" in _record(_chunk(1, [5]), _chunk(3, [7])).sequence_problems[0]
    assert "duplicate" in _record(_chunk(1, [5]), _chunk(2, [6]),
                                  _chunk(2, [6])).sequence_problems[0]
    assert "reorder" in _record(_chunk(1, [5]), _chunk(3, [7]),
                                _chunk(2, [6])).sequence_problems[-1]
    # and the stream checker turns them into a counterexample
    from invariants import RunContext, StreamWellFormed
    from ordeal.history.ops import Op
    rec = _record(_chunk(1, [5]), _chunk(1, [5]))
    op = Op(0, 0, "w", "ok", 1, "completions", {"stream": {**rec.to_value(),
                                                           "finish_reasons": ["length"]}})
    r = StreamWellFormed().check([op], RunContext())
    assert r.valid is False and r.details["sequence_broken"] == 1


def test_the_record_keeps_columns_and_a_cut_stream_keeps_its_times():
    r = recorded(
        'data: {"id":"c1","choices":[{"text":"a","finish_reason":null}]}',
        'data: {"id":"c1","choices":[{"text":"","finish_reason":null}]}',
        'data: {"id":"c1","choices":[{"text":"b","finish_reason":"stop"}]}')
    value = r.to_value()
    assert value["texts"] == ["a", "", "b"] and "chunks" not in value and "t_ms" not in value
    # An op with no ttft_ms/itl_ms (a timeout, a reset) still says when each event came.
    assert r.to_value(start_ns=500_000)["t_ms"] == [0.5, 1.5, 2.5]


def test_stream_texts_reads_the_column_and_the_dicts_of_older_histories():
    from ordeal.history.ops import stream_texts
    assert stream_texts({"texts": ["a", "", "b"]}) == ["a", "", "b"]
    assert stream_texts({"chunks": [{"t_ms": 1.0, "text": "a"}, {"text": None}, "junk"]}) == [
        "a", "", ""]
    assert stream_texts(None) == [] and stream_texts({"n_chunks": 0}) == []
    # and the usage checker counts content events from either form
    from invariants.usage import usage_problems
    value = {"usage": {"completion_tokens": 1}, "stream": {"texts": ["a", "b"]}}
    assert usage_problems(value, 4) == ("bounded_only", ["2 content chunks for 1 billed tokens"])
    old = {"usage": {"completion_tokens": 1},
           "stream": {"chunks": [{"text": "a"}, {"text": "b"}]}}
    assert usage_problems(old, 4) == usage_problems(value, 4)
