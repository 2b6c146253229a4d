"""No duplicated execution: replicas' served journals, one count per request
id. Planted duplicates are caught; legitimate retries are only counted."""

import json

from invariants import CheckerSettings, RunContext
from invariants.duplicates import NoDuplicateExecution
from ordeal.history.ops import Op
from ordeal.journal import JournalTail

S = 1_000_000_000


def served(i, t, node, *entries, error=None):
    return Op(i, int(t * S), "w", "info", "monitor", "served",
              {"node": node, "entries": [list(e) for e in entries]}, error)


def test_each_request_once_is_valid():
    h = [served(0, 1, "replica-0", ("a", 200, True), ("b", 200, True)),
         served(1, 2, "replica-1", ("c", 200, True))]
    r = NoDuplicateExecution().check(h, RunContext())
    assert r.valid is True, r.details
    assert r.details["requests"] == 3 and r.details["completed"] == 3


def test_a_request_completed_on_two_replicas_is_caught():
    h = [served(0, 1, "replica-0", ("a", 200, True), ("b", 200, True)),
         served(1, 2, "replica-1", ("b", 200, True))]
    r = NoDuplicateExecution().check(h, RunContext())
    assert r.valid is False
    assert r.details["duplicated"] == 1
    [ce] = r.counterexamples
    assert ce["request_id"] == "b"
    assert ce["executions"] == ["replica-0:200:complete", "replica-1:200:complete"]


def test_same_replica_twice_is_a_duplicate_too():
    h = [served(0, 1, "replica-0", ("a", 200, True)), served(1, 3, "replica-0", ("a", 200, True))]
    assert NoDuplicateExecution().check(h, RunContext()).valid is False


def test_retry_after_a_cut_attempt_is_counted_not_judged():
    h = [served(0, 1, "replica-0", ("a", 200, False)), served(1, 2, "replica-1", ("a", 200, True)),
         served(2, 2, "replica-1", ("b", 500, True), ("b", 200, True))]
    r = NoDuplicateExecution().check(h, RunContext())
    assert r.valid is True, r.counterexamples
    assert r.details["retried"] == 2 and r.details["duplicated"] == 0


def test_ids_are_forgotten_after_the_window_so_memory_stays_bounded():
    ctx = RunContext(settings=CheckerSettings(duplicate_window_s=60))
    c = NoDuplicateExecution()
    c.start(ctx)
    for i in range(1000):
        c.feed(served(i, i, "replica-0", (f"r{i}", 200, True)))
    assert len(c.seen) <= 61
    assert c.result().valid is True


def test_no_journal_is_unknown_and_journal_errors_are_counted():
    assert NoDuplicateExecution().check([], RunContext()).valid == "unknown"
    h = [served(0, 1, "replica-0", ("a", 200, True), error="bad journal line")]
    r = NoDuplicateExecution().check(h, RunContext())
    assert r.details["journal_errors"] == 1


def test_journal_tail_reads_only_new_whole_lines_and_reports_bad_ones(tmp_path):
    p = tmp_path / "replica-0.served.jsonl"
    p.write_text(json.dumps({"rid": "old", "status": 200, "complete": True}) + "\n")
    tail = JournalTail(p)  # starts at the end: "old" belongs to an earlier run
    with p.open("a") as f:
        f.write(json.dumps({"rid": "a", "phase": "begin"}) + "\n")
        f.write(json.dumps({"rid": "a", "phase": "end", "status": 200, "complete": True}) + "\n")
        f.write("not json\n")
        f.write('{"rid": "b", "sta')  # a line being written right now
    entries, begun, bad = tail.read_new()
    assert entries == [["a", 200, True]] and begun == ["a"]
    assert len(bad) == 1 and "not json" in bad[0]
    with p.open("a") as f:
        f.write('tus": 499, "complete": false}\n')
    assert tail.read_new() == ([["b", 499, False]], [], [])


def test_result_mid_run_changes_nothing_so_the_judge_need_not_copy_it():
    """pure_result: the endurance judge asks this checker directly, every
    progress line; asking must not alter what it says at the end."""
    assert NoDuplicateExecution.pure_result is True
    h = [served(0, 1, "replica-0", ("a", 200, True), ("b", 200, True)),
         served(1, 2, "replica-1", ("b", 200, True)),
         served(2, 3, "replica-1", ("c", 200, False)), served(3, 4, "replica-0", ("c", 200, True))]
    asked, quiet = NoDuplicateExecution(), NoDuplicateExecution()
    asked.start(RunContext())
    quiet.start(RunContext())
    mid = []
    for op in h:
        asked.feed(op)
        quiet.feed(op)
        mid.append(asked.result())
    mid[-1].counterexamples.append({"tampered": True})  # the caller's copy, not the state
    assert asked.result().to_dict() == quiet.result().to_dict()
    assert [m.valid for m in mid] == [True, False, False, False]


def nemesis(i, t, f, phase, kind="connection_reset", target="router-replica-0"):
    return Op(i, int(t * S), "w", "info", "nemesis", f,
              {"kind": kind, "target": target, "phase": phase}, None)


def reset_window(i, start, end):
    return [nemesis(i, start, "inject", "begin"), nemesis(i + 1, start, "inject", "end"),
            nemesis(i + 2, end, "heal", "begin"), nemesis(i + 3, end, "heal", "end")]


def test_a_duplicate_is_put_in_its_fault_window_so_a_known_finding_can_name_it():
    """The 2.5 h run's finding: vllm-router re-sent completed requests during
    connection_reset. Seen in the window, or within the journal lag after
    it; outside both, in no window."""
    h = [*reset_window(0, 10, 40),
         served(4, 11, "replica-0", ("a", 200, True)),
         served(5, 12, "replica-0", ("a", 200, True)),  # inside the window
         served(6, 41, "replica-0", ("b", 200, True)),
         served(7, 43, "replica-1", ("b", 200, True))]  # 3 s after its heal: the lag
    r = NoDuplicateExecution().check(sorted(h, key=lambda o: o.time_ns), RunContext())
    assert r.valid is False and r.details["duplicated"] == 2
    assert r.details["violations_by_window"] == {"connection_reset@router-replica-0#1": 2}
    assert [c["window"] for c in r.counterexamples] == ["connection_reset@router-replica-0#1"] * 2
    # The shipped known-findings file names it: known, not a new failure.
    from invariants.known import embedded_file, read_known_findings
    shipped = embedded_file(["vllm-0.32.0-x", "vllm-router-0.1.17"])
    said = read_known_findings(shipped).apply([r.to_dict() | {"valid": False}], [])
    assert [m["invariant"] for m in said["matched"]] == ["no_duplicate_execution"], said
    # Long after the heal, a duplicate is in no window: not covered by that finding.
    late = [*reset_window(0, 10, 40), served(4, 60, "replica-0", ("c", 200, True)),
            served(5, 61, "replica-0", ("c", 200, True))]
    r = NoDuplicateExecution().check(late, RunContext())
    assert r.details["in_no_fault_window"] == 1 and "violations_by_window" not in r.details
    d = r.to_dict()
    assert read_known_findings(shipped).apply([d], []).get("matched") == []
    assert "known" not in d
