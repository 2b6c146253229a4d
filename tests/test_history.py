import json
import re

import pytest

from ordeal.history import History, HistoryError, read_history


def test_ops_are_written_while_the_run_goes_and_read_back(tmp_path):
    path = tmp_path / "history.jsonl"
    h = History(path, flush_interval=0)
    h.append("invoke", 1, "completions", {"prompt": "hi"})
    # Flushed before close: a crash now would keep it.
    assert len(path.read_text().splitlines()) == 1
    h.append("ok", 1, "completions", {"output_tokens": 3})
    h.append("info", "nemesis", "inject", {"kind": "process_kill"})
    h.close()
    ops = list(read_history(path))
    assert [o.index for o in ops] == [0, 1, 2]
    assert [o.type for o in ops] == ["invoke", "ok", "info"]
    assert ops[0].time_ns <= ops[1].time_ns <= ops[2].time_ns
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o.wall) for o in ops)
    assert h.counts == {"invoke": 1, "ok": 1, "fail": 0, "info": 0}
    assert h.nemesis_counts["info"] == 1


def test_a_torn_final_line_is_reported_not_silently_dropped(tmp_path):
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        h.append("invoke", 1, "completions")
    with path.open("a") as f:
        f.write('{"index": 1, "time_ns": 5, "wall": "x", "ty')  # the crash
    with pytest.raises(HistoryError, match=r":2: torn final line"):
        list(read_history(path))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert len(ops) == 1 and len(problems) == 1 and "torn final line" in problems[0]


def test_a_corrupt_line_is_named_and_the_rest_is_still_read(tmp_path):
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        for p in range(3):
            h.append("invoke", p, "completions")
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20] + "\x00garbage"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryError, match=r"history.jsonl:2: not a valid op"):
        list(read_history(path))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.process for o in ops] == [0, 2] and ":2: not a valid op" in problems[0]


def test_an_older_format_is_named_as_such(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"type": "invoke", "process": 1, "f": "x", "time": 5}\n')
    with pytest.raises(HistoryError, match=r":1: .*missing \['index', 'time_ns', 'wall'\].*older"):
        list(read_history(path))


def test_a_closed_history_refuses_new_ops(tmp_path):
    h = History(tmp_path / "h.jsonl")
    h.close()
    with pytest.raises(RuntimeError, match="closed"):
        h.append("invoke", 1, "x")


def test_ops_are_plain_json(tmp_path):
    path = tmp_path / "h.jsonl"
    with History(path) as h:
        h.append("fail", 7, "chat", {"status": 503}, "HTTP 503: busy")
    d = json.loads(path.read_text())
    assert d["type"] == "fail" and d["error"] == "HTTP 503: busy" and d["value"]["status"] == 503
