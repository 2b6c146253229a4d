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
    with pytest.raises(HistoryError, match="torn|not a valid op"):
        list(read_history(path))
    torn = []
    ops = list(read_history(path, on_torn_tail=torn.append))
    assert len(ops) == 1 and len(torn) == 1 and "torn final line" in torn[0]


def test_a_damaged_line_in_the_middle_is_rejected_with_its_line_number(tmp_path):
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        h.append("invoke", 1, "completions")
        h.append("ok", 1, "completions")
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"invoke"', '"bogus"')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryError, match=r":1: not a valid op"):
        list(read_history(path, on_torn_tail=lambda _: None))


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
