import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from invariants.base import RunContext
from invariants.no_silent_loss import NoSilentLoss
from ordeal.history.ops import Op
from ordeal.history.reader import HistoryError, HistoryTail, read_history
from ordeal.history.writer import GAP_ERROR, History

ROOT = Path(__file__).resolve().parent.parent


def test_ops_are_written_while_the_run_goes_and_read_back(tmp_path):
    path = tmp_path / "history.jsonl"
    h = History(path)
    h.append("invoke", 1, "completions", {"prompt": "hi"})
    # Written to the OS on append, before any seal: a SIGKILL now would keep it.
    assert [json.loads(x)["index"] for x in path.read_text().splitlines() if '"index"' in x] == [0]
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
    # line 1 header, 2 the op, 3 its chunk's trailer, 4 the torn line
    with pytest.raises(HistoryError, match=r":4: torn final line"):
        list(read_history(path))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert len(ops) == 1 and len(problems) == 1 and "torn final line" in problems[0]


def plain_file(path, n, corrupt_line=None):
    """A format-1 history (plain JSONL, no header), as written before chunks."""
    lines = [Op(i, 1000 + i, "2026-01-01T00:00:00.000Z", "invoke", i, "completions").to_json()
             for i in range(n)]
    if corrupt_line is not None:
        lines[corrupt_line - 1] = lines[corrupt_line - 1][:20] + "\x00garbage"
    path.write_text("\n".join(lines) + "\n")


def test_a_corrupt_line_of_a_plain_file_is_named_and_the_rest_is_still_read(tmp_path):
    path = tmp_path / "history.jsonl"
    plain_file(path, 3, corrupt_line=2)
    with pytest.raises(HistoryError, match=r"history.jsonl:2: not a valid op"):
        list(read_history(path))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.process for o in ops] == [0, 2] and ":2: not a valid op" in problems[0]


def test_a_plain_jsonl_file_of_before_chunks_still_reads_as_before(tmp_path):
    path = tmp_path / "history.jsonl"
    plain_file(path, 5000)
    with path.open("a") as f:
        f.write("\n")  # blank lines were always skipped
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == list(range(5000)) and problems == []
    with pytest.raises(HistoryError, match="plain JSON Lines"):
        History.resume(path)


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


def test_ops_are_plain_json_and_store_records_are_told_apart(tmp_path):
    path = tmp_path / "h.jsonl"
    with History(path) as h:
        h.append("fail", 7, "chat", {"status": 503}, "HTTP 503: busy")
    header, op, trailer = (json.loads(x) for x in path.read_text().splitlines())
    assert op["type"] == "fail" and op["error"] == "HTTP 503: busy" and op["value"]["status"] == 503
    # grep/jq: a line with "chunk" and no "index" is never an op.
    assert header["chunk"] == -1 and header["ordeal_history"] == 2 and "index" not in header
    assert trailer == {"chunk": 0, "first": 0, "ops": 1, "bytes": trailer["bytes"],
                       "crc32c": trailer["crc32c"]}
    assert re.fullmatch(r"[0-9a-f]{8}", trailer["crc32c"])


# -- chunks -----------------------------------------------------------------------


def chunked(path, n=50, per=10):
    """n ops in chunks of ``per``: chunk k holds ops k*per .. k*per+per-1."""
    with History(path, flush_interval=3600, chunk_max_ops=per) as h:
        for i in range(n):
            h.append("invoke" if i % 2 == 0 else "ok", i // 2, "completions", {"seq": i // 2})
    return path.read_bytes().splitlines(keepends=True)


def chunk_spans(lines):
    """chunk number -> (first line, trailer line), 0-based line numbers."""
    spans, start = {}, 1
    for i, raw in enumerate(lines[1:], start=1):
        d = json.loads(raw)
        if "chunk" in d and "index" not in d:
            spans[d["chunk"]] = (start, i)
            start = i + 1
    return spans


def test_chunks_are_sealed_by_count_and_cover_every_op(tmp_path):
    lines = chunked(tmp_path / "h.jsonl", n=45, per=10)
    spans = chunk_spans(lines)
    assert list(spans) == [0, 1, 2, 3, 4]  # 10+10+10+10+5: close seals the last
    assert all(e - s == (10 if k < 4 else 5) for k, (s, e) in spans.items())


@pytest.mark.parametrize("flip", ["a digit (still valid JSON)", "a garbage byte"])
def test_a_flipped_byte_rejects_exactly_its_chunk(tmp_path, flip):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    s, e = chunk_spans(lines)[2]  # ops 20-29
    victim = bytearray(lines[s + 3])
    at = victim.index(b'"time_ns":') + len(b'"time_ns":') + 2
    victim[at] = (ord("0") + (victim[at] - ord("0") + 1) % 10) if flip.startswith("a digit") \
        else 0xFF
    lines[s + 3] = bytes(victim)
    path.write_bytes(b"".join(lines))

    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == [i for i in range(50) if not 20 <= i <= 29]
    assert len(problems) == 1
    assert re.search(rf"chunk 2 \(lines {s + 1}-{e + 1}, bytes \d+-\d+, ops 20-29\): "
                     r"CRC-32C mismatch \(stored [0-9a-f]{8}, computed [0-9a-f]{8}\): the chunk "
                     r"was altered after it was written; its 10 ops are not used", problems[0])
    with pytest.raises(HistoryError, match=r"chunk 2 .*CRC-32C mismatch.*in other chunks are intact"):
        list(read_history(path))


def test_a_repeated_chunk_is_out_of_sequence_and_not_counted_twice(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    s, e = chunk_spans(lines)[1]
    path.write_bytes(b"".join(lines[:e + 1] + lines[s:e + 1] + lines[e + 1:]))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == list(range(50))  # each op once
    assert len(problems) == 1 and "chunk 1 (" in problems[0]
    assert "out of sequence: chunk 1 where chunk 2 was due" in problems[0]


def test_swapped_chunks_are_both_rejected(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    spans = chunk_spans(lines)
    (s1, e1), (s2, e2) = spans[1], spans[2]
    path.write_bytes(b"".join(lines[:s1] + lines[s2:e2 + 1] + lines[s1:e1 + 1] + lines[e2 + 1:]))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == [i for i in range(50) if not 10 <= i <= 29]
    assert len(problems) == 2 and all("out of sequence" in m for m in problems)
    assert "chunk 2 where chunk 1 was due" in problems[0]


@pytest.mark.parametrize("was, now", [(b'"crc32c":"', b'"crc32c":'),  # not JSON any more
                                     (b'{"chunk":', b'{"chunc":'),  # its first bytes
                                     (b'"chunk":1,', b'"chunk":"1",')])
def test_a_garbled_trailer_is_reported_and_costs_only_its_chunk(tmp_path, was, now):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    s, e = chunk_spans(lines)[1]
    assert was in lines[e]
    lines[e] = lines[e].replace(was, now)
    path.write_bytes(b"".join(lines))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == [i for i in range(50) if not 10 <= i <= 19]
    assert len(problems) == 1
    assert f"chunk 1 (lines {s + 1}-{e + 1}" in problems[0]
    assert f"its trailer (line {e + 1}) is damaged" in problems[0]


@pytest.mark.parametrize("field, was, now, reason", [
    ("ops", 10, 11, "it holds 10 lines where its trailer says 11 ops"),
    ("bytes", None, None, "bytes where its trailer says"),
    ("first", 30, 31, "its first op is index 30 where its trailer says 31"),
])
def test_a_trailer_whose_figures_were_altered_rejects_its_chunk(tmp_path, field, was, now,
                                                                 reason):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    _, e = chunk_spans(lines)[3]
    t = json.loads(lines[e])
    t[field] = t[field] + 1 if was is None else now
    lines[e] = json.dumps(t, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == [i for i in range(50) if not 30 <= i <= 39]
    assert len(problems) == 1 and reason in problems[0] and "chunk 3 (" in problems[0]


def test_a_lost_trailer_does_not_let_unverified_ops_through(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    _, e = chunk_spans(lines)[1]
    del lines[e]
    path.write_bytes(b"".join(lines))
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == [i for i in range(50) if not 10 <= i <= 29]
    assert len(problems) == 2 and all("are not used" in m for m in problems)
    # The reader holds at most a chunk: 11 lines without a trailer are given up at once.
    assert "11 lines without a trailer, more than a chunk holds (10)" in problems[0]
    assert "out of sequence: chunk 2 where chunk 1 was due" in problems[1]


def test_the_unsealed_tail_is_read_with_a_note_and_a_torn_line_is_named(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path, n=20, per=10)
    tail = [Op(i, 5, "w", "invoke", i, "x").to_json().encode() + b"\n" for i in (20, 21)]
    path.write_bytes(b"".join(lines) + b"".join(tail) + b'{"index":22,"ti')
    problems = []
    ops = list(read_history(path, on_error=problems.append))
    assert [o.index for o in ops] == list(range(22))
    assert len(problems) == 2
    assert ":26: torn final line" in problems[0]
    assert "2 ops after the last sealed chunk (chunk 1) are unverified" in problems[1]
    path.write_bytes(b"".join(lines) + b"".join(tail))
    assert [o.index for o in read_history(path)] == list(range(22))  # a note never raises


def test_an_idle_chunk_is_sealed_within_the_flush_interval(tmp_path):
    path = tmp_path / "h.jsonl"
    h = History(path, flush_interval=0.2)
    h.append("invoke", 1, "x")
    deadline = time.monotonic() + 5
    while b'"chunk":0' not in path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b'"chunk":0' in path.read_bytes(), "nothing sealed the idle chunk"
    problems = []
    assert len(list(read_history(path, on_error=problems.append))) == 1 and problems == []
    h.close()


def test_a_history_left_open_is_sealed_at_exit(tmp_path):
    path = tmp_path / "h.jsonl"
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from ordeal.history.writer import History; "
            "h = History(sys.argv[1], flush_interval=3600); h.append('invoke', 1, 'x')")
    subprocess.run([sys.executable, "-c", code, str(path), str(ROOT)], check=True, timeout=60)
    problems = []
    assert len(list(read_history(path, on_error=problems.append))) == 1
    assert problems == [] and path.read_bytes().endswith(b"}\n") and b'"chunk":0' in path.read_bytes()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_writer_memory_is_flat_however_many_ops(tmp_path):
    h = History(tmp_path / "h.jsonl", chunk_max_ops=4096)
    value = {"prompt": "p" * 40, "max_tokens": 16}
    for i in range(10_000):
        h.append("invoke", i, "completions", value)
    # Every Python allocation over 5k appends (tracemalloc costs ~0.2 ms an append) ...
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5_000):
            h.append("invoke", i, "completions", value)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 32 * 1024, f"the writer kept {grown} bytes over 5k ops"
    # ... and the process over 100k more (~15 MB on disk; kept ops would show here).
    rss = rss_bytes()
    for i in range(100_000):
        h.append("invoke", i, "completions", value)
    assert rss_bytes() - rss < 4 << 20, f"RSS grew {(rss_bytes() - rss) >> 20} MiB"
    h.close()


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "h.jsonl"
    h = History(path)
    with pytest.raises(HistoryError, match="another History"):
        History.resume(path)
    h.append("invoke", 1, "x")
    h.close()
    with pytest.raises(HistoryError, match=r"already holds a history; History.resume"):
        History(path)


# -- resume after the harness is SIGKILLed ------------------------------------------

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from ordeal.history.writer import History
h = History(sys.argv[1], flush_interval=3600, chunk_max_ops=25)
for i in range(100):  # 200 ops: 8 sealed chunks
    h.append("invoke", i, "completions", {"seq": i, "request_id": f"r-{i}"})
    h.append("ok", i, "completions", {"seq": i})
h.append("info", "nemesis", "inject", {"kind": "process_kill", "phase": "begin"})
for i in range(100, 103):  # in flight when the harness dies
    h.append("invoke", i, "completions", {"seq": i, "request_id": f"r-{i}"})
h.append("info", "monitor", "sample", {"node": "replica-0"})
print("READY", flush=True)
time.sleep(600)
"""


def killed_writer(path):
    """A harness that writes 205 ops (the last 5 unsealed), then is SIGKILLed."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(ROOT)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("torn", [False, True])
def test_resume_after_sigkill_seals_the_tail_and_loses_or_repeats_nothing(tmp_path, torn):
    path = tmp_path / "history.jsonl"
    killed_writer(path)
    if torn:  # as if it died inside a write
        with path.open("ab") as f:
            f.write(b'{"index":205,"time_ns":1,"wa')
    problems = []
    h = History.resume(path, on_error=problems.append)
    r = h.resumed
    assert r.ops == 205 and r.last_index == 204 and r.sealed_tail_ops == 5
    assert r.rejected_chunks == 0 and r.dropped_lines == (1 if torn else 0)
    assert len(problems) == (2 if torn else 0) and r.problems == problems
    if torn:
        assert "torn final line" in problems[0] and "removed 1 torn" in problems[1]
    assert [(o.process, o.value["seq"]) for o in r.open_invokes] == [(100, 100), (101, 101),
                                                                     (102, 102)]
    assert h.counts == {"invoke": 103, "ok": 100, "fail": 0, "info": 0}
    assert h.nemesis_counts["info"] == 1
    # The tail is sealed as chunk 8, right after the 8 chunks of 25 the writer sealed.
    assert list(chunk_spans(path.read_bytes().splitlines(keepends=True))) == list(range(9))

    gap = h.record_gap("harness SIGKILLed by the test")
    assert gap.index == 205 and gap.f == "gap" and gap.process == "monitor"
    assert gap.value["open_invokes"] == 3 and gap.value["from"] == r.last_wall
    assert h.record_gap().value["open_invokes"] == 0  # nothing completed twice
    for i in range(103, 110):  # the resumed run goes on
        h.append("invoke", i, "completions", {"seq": i})
        h.append("ok", i, "completions", {"seq": i})
    h.close()
    assert h.counts == {"invoke": 110, "ok": 107, "fail": 0, "info": 3}

    after = []
    ops = list(read_history(path, on_error=after.append))
    assert after == []  # every chunk verifies; no unsealed tail
    assert [o.index for o in ops] == list(range(len(ops)))  # every op once, no gap in indexes
    gaps = [o for o in ops if o.f == "gap"]
    assert len(gaps) == 2 and gaps[0].value["reason"] == "harness SIGKILLed by the test"
    died = [o for o in ops if o.error == GAP_ERROR]
    assert [(o.process, o.type, o.value["invoke_index"]) for o in died] == [
        (100, "info", 201), (101, "info", 202), (102, "info", 203)]
    assert all(a.time_ns <= b.time_ns for a, b in zip(ops, ops[1:]))
    loss = NoSilentLoss().check(ops, RunContext())
    assert loss.valid is True and loss.details["invoked"] == 110, loss.details


def test_resume_keeps_a_last_op_that_lost_only_its_newline(tmp_path):
    path = tmp_path / "h.jsonl"
    chunked(path, n=20, per=10)
    tail = [Op(i, 5, "w", "invoke", i, "x").to_json().encode() for i in (20, 21)]
    with path.open("ab") as f:
        f.write(tail[0] + b"\n" + tail[1])
    h = History.resume(path)
    assert (h.resumed.sealed_tail_ops, h.resumed.dropped_lines, h.resumed.ops) == (2, 0, 22)
    h.append("ok", 21, "x")
    h.close()
    problems = []
    assert [o.index for o in read_history(path, on_error=problems.append)] == list(range(23))
    assert problems == []


def test_resume_of_a_closed_history_continues_its_numbers(tmp_path):
    path = tmp_path / "h.jsonl"
    chunked(path, n=20, per=10)
    h = History.resume(path)
    assert h.resumed.sealed_tail_ops == 0 and h.resumed.open_invokes == []
    assert h.append("invoke", 99, "x").index == 20
    h.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert list(chunk_spans(lines)) == [0, 1, 2]
    problems = []
    assert [o.index for o in read_history(path, on_error=problems.append)] == list(range(21))
    assert problems == []


# -- following a growing history (HistoryTail) -------------------------------------


def test_the_tail_yields_each_chunk_once_it_is_sealed(tmp_path):
    path = tmp_path / "h.jsonl"
    tail = HistoryTail(path)
    assert list(tail.read_new()) == []  # no file yet
    h = History(path, flush_interval=3600, chunk_max_ops=4)
    for i in range(3):
        h.append("invoke", i, "x")
    assert list(tail.read_new()) == []  # written, not sealed: not verified yet
    h.append("invoke", 3, "x")  # the fourth op seals the chunk
    assert [o.index for o in tail.read_new()] == [0, 1, 2, 3]
    h.append("ok", 0, "x")
    assert list(tail.read_new()) == []
    h.flush()
    assert [o.index for o in tail.read_new()] == [4]
    assert list(tail.read_new()) == []  # each op once
    h.append("ok", 1, "x")
    h.close()
    assert [o.index for o in tail.read_rest()] == [5]
    assert list(tail.read_rest()) == []


def grown(path, data, cuts):
    """Write ``data`` to ``path`` in the pieces ``cuts`` makes (mid-line too),
    reading the tail after each piece; then the rest, as a finished writer."""
    problems = []
    tail = HistoryTail(path, on_error=problems.append)
    ops = []
    path.write_bytes(b"")
    for at in [*sorted(cuts), len(data)]:
        with path.open("r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(data[f.tell():at])
        ops += tail.read_new()
    ops += tail.read_rest()
    return ops, problems


def test_the_tail_reads_a_growing_file_exactly_as_read_history(tmp_path):
    """Cut anywhere, a damaged chunk among them and a torn last line: the
    tail yields the same ops, and reports the same damage in the same words."""
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    s, _ = chunk_spans(lines)[2]
    lines[s + 3] = lines[s + 3].replace(b'"seq":', b'"seq": ')  # chunk 2 altered
    extra = [Op(i, 5, "w", "invoke", i, "x").to_json().encode() + b"\n" for i in (50, 51)]
    data = b"".join(lines + extra) + b'{"index":52,"ti'
    path.write_bytes(data)
    want_problems = []
    want = list(read_history(path, on_error=want_problems.append))
    assert len(want_problems) == 3  # chunk 2, the torn line, the unsealed note
    rng = random.Random(7)
    for cuts in ([], [1, 2, 3], range(0, len(data), 97), rng.sample(range(len(data)), 40),
                 [len(lines[0]) - 1, len(lines[0]) + 5]):
        got, problems = grown(path, data, cuts)
        assert got == want and problems == want_problems, cuts


def test_a_damaged_chunk_stops_a_tail_without_on_error_as_it_stops_read_history(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path)
    s, _ = chunk_spans(lines)[1]
    lines[s] = lines[s].replace(b'"seq":', b'"seq": ')
    path.write_bytes(b"".join(lines))
    with pytest.raises(HistoryError) as by_reader:
        list(read_history(path))
    tail = HistoryTail(path)
    got = []
    with pytest.raises(HistoryError) as by_tail:
        for op in tail.read_new():
            got.append(op.index)
    assert str(by_tail.value) == str(by_reader.value)
    assert "chunk 1" in str(by_tail.value) and got == list(range(10))


def test_the_tail_leaves_a_line_being_written_and_names_a_torn_one(tmp_path):
    path = tmp_path / "h.jsonl"
    lines = chunked(path, n=20, per=10)
    trailer = lines.pop()  # chunk 1's trailer, being written
    path.write_bytes(b"".join(lines) + trailer[:7])
    problems = []
    tail = HistoryTail(path, on_error=problems.append)
    assert [o.index for o in tail.read_new()] == list(range(10))
    assert problems == []  # half a line is not damage while the writer may finish it
    with path.open("ab") as f:
        f.write(trailer[7:])
    assert [o.index for o in tail.read_new()] == list(range(10, 20)) and problems == []
    with path.open("ab") as f:  # the writer died mid-line
        f.write(Op(20, 5, "w", "invoke", 20, "x").to_json().encode() + b"\n" + b'{"index":21,')
    assert list(tail.read_new()) == []
    assert [o.index for o in tail.read_rest()] == [20]
    want = []
    assert [o.index for o in read_history(path, on_error=want.append)] == list(range(21))
    assert problems == want and "torn final line" in problems[0]
