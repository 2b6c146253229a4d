"""summary.json's timing of a resumed run (issue 39, item 11): ``started``
is the first segment's, ``duration_s`` the sum of the segments' durations
(monotonic), ``down_s`` the gaps between them, and ``segments`` lists each
one. The earlier segments come from the history, the one record a
SIGKILLed harness leaves (it writes no summary). No cluster: the harnesses
are simulated on a real history file."""

from __future__ import annotations

import json
import time

from ordeal.history.ops import parse_iso
from ordeal.history.writer import History
from reports.run_dir import RunDir
from reports.summary import build_summary
from runs.run import OrdealRun

RAN_S = 0.4  # each segment at least
DOWN_S = 0.5  # each gap at least


def segment(run_dir: RunDir, history: History, seq: int, finish: bool = False) -> dict | None:
    """One harness: requests for RAN_S, the last left in flight; then it
    dies (its history is closed, no summary) or, with ``finish``, writes
    the summary as a run does."""
    run = OrdealRun(run_dir, "endurance", None, progress=lambda _m: None, history=history)
    history.append("invoke", 1, "completions", {"seq": seq})
    history.append("ok", 1, "completions", {"seq": seq})
    time.sleep(RAN_S)
    history.append("invoke", 1, "completions", {"seq": seq + 1})
    if finish:
        return run.finish()
    history.close()  # the kill: what was appended is in the file, nothing else is written
    return None


def test_a_resumed_runs_summary_covers_every_segment(tmp_path):
    run_dir = RunDir.create(tmp_path, "endurance")
    segment(run_dir, History(run_dir.history_path), 0)
    for n in (1, 2):
        time.sleep(DOWN_S)
        history = History.resume(run_dir.history_path)
        history.record_gap(reason=f"harness died; resume {n}")
        summary = segment(run_dir, history, 10 * n, finish=n == 2)
    assert summary is not None

    header = json.loads(run_dir.history_path.read_text().splitlines()[0])
    segs = summary["segments"]
    assert len(segs) == 3, segs
    # The whole run: from the first harness's start, not the last's.
    assert summary["started"] == segs[0]["started"] == header["created"]
    assert summary["ended"] == segs[-1]["ended"]
    assert "resumed_from_gap" not in segs[0]
    for seg in segs:
        assert seg["duration_s"] >= RAN_S, segs
        assert parse_iso(seg["started"]) <= parse_iso(seg["ended"]), seg
    for before, after in zip(segs, segs[1:]):
        gap = after["resumed_from_gap"]
        assert gap["down_s"] >= DOWN_S, gap
        # The gap ends when the resumed harness recorded it; its segment
        # starts when that harness's run began, right after (ms apart).
        assert gap["from"] == before["ended"], (before, after)
        assert 0 <= parse_iso(after["started"]) - parse_iso(gap["to"]) < 1.0, (before, after)
    # duration_s: the segments' durations summed; the gaps apart, in down_s.
    assert summary["duration_s"] == round(sum(s["duration_s"] for s in segs), 3)
    assert summary["duration_s"] >= 3 * RAN_S
    assert summary["down_s"] == round(sum(s["resumed_from_gap"]["down_s"] for s in segs[1:]), 3)
    assert summary["down_s"] >= 2 * DOWN_S
    span = parse_iso(summary["ended"]) - parse_iso(summary["started"])
    assert abs(span - (summary["duration_s"] + summary["down_s"])) < 0.5, (span, summary)
    # On disk as returned, and in report.html.
    assert json.loads(run_dir.summary_path.read_text())["segments"] == segs
    page = (run_dir.path / "report.html").read_text()
    assert "over 3 segments" in page and segs[0]["started"] in page


def test_a_run_never_resumed_is_one_segment(tmp_path):
    run_dir = RunDir.create(tmp_path, "smoke")
    history = History(run_dir.history_path)
    summary = OrdealRun(run_dir, "smoke", None, progress=lambda _m: None,
                        history=history).finish()
    assert summary["segments"] == [{"started": summary["started"], "ended": summary["ended"],
                                    "duration_s": summary["duration_s"]}]
    assert summary["down_s"] == 0
    bare = build_summary(run_id="r", suite="s", started="", ended="", cluster={}, counts={},
                         nemesis_counts={}, faults=[], invariants=[], workload={})
    assert bare["duration_s"] is None and len(bare["segments"]) == 1


def test_a_segment_of_a_history_without_created_time_ns_starts_at_its_first_op(tmp_path):
    """A history written before the header had ``created_time_ns``: its
    first segment is measured from its first op."""
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        first = h.append("invoke", 1, "completions", {"seq": 0})
        time.sleep(0.2)
        last = h.append("ok", 1, "completions", {"seq": 0})
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["created_time_ns"]
    path.write_text(json.dumps(header, separators=(",", ":")) + "\n" + "".join(lines[1:]))
    h = History.resume(path)
    try:
        (seg,) = h.resumed.segments
        assert seg["duration_s"] == round((last.time_ns - first.time_ns) / 1e9, 3)
        assert seg["started"] == header["created"] and seg["ended"] == last.wall
    finally:
        h.close()
