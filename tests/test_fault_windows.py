"""Fault windows from the nemesis ops (ordeal.history.windows): fed op by op
they are what a plain reading of the whole history gives, and a live tail
of the file gives the same windows as the finished file."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ordeal.history.ops import Op
from ordeal.history.reader import HistoryTail, read_history
from ordeal.history.windows import (
    CLOSED,
    HEALING,
    INJECT_FAILED,
    INJECTED,
    OPENED,
    FaultWindows,
    Window,
    fault_windows,
)
from ordeal.history.writer import History

KEYS = [("process_kill", "replica-0"), ("lsn_jump", "router-replica-0"),
        ("network_latency", "router-replica-1")]
ACTIONS = [("inject", "begin"), ("inject", "end"), ("inject", "refused"), ("heal", "begin"),
           ("heal", "end")]

# An event: a nemesis op (key, action, error?, fault_id?), a gap, or a client op.
events = st.lists(st.one_of(
    st.tuples(st.integers(0, len(KEYS) - 1), st.integers(0, len(ACTIONS) - 1), st.booleans(),
              st.sampled_from([None, "id-1", "id-2"])),
    st.just("gap"), st.just("request")), max_size=60)


def build(evs):
    ops = []
    for i, e in enumerate(evs):
        t, wall = (i + 1) * 1000, f"w{i}"
        if e == "gap":
            ops.append(Op(i, t, wall, "info", "monitor", "gap", {"from": "a", "to": "b"}))
        elif e == "request":
            ops.append(Op(i, t, wall, "invoke", 7, "completions", {}))
        else:
            k, a, err, fid = e
            (kind, target), (f, phase) = KEYS[k], ACTIONS[a]
            value = {"kind": kind, "target": target, "phase": phase}
            if fid:
                value["fault_id"] = fid
            ops.append(Op(i, t, wall, "info", "nemesis", f, value, "boom" if err else None))
    return ops


def reference(ops, gaps=True):
    """Each window read off the whole history at once: from its inject/begin
    to the first heal/end of its key (or gap) before another inject/begin of
    the key takes the key over."""
    def key(op):
        return f"{op.value['kind']}@{op.value['target']}"

    def is_(op, f, phase):
        return op.process == "nemesis" and op.f == f and op.value["phase"] == phase

    out, counts = [], {}
    for i, op in enumerate(ops):
        if not is_(op, "inject", "begin"):
            continue
        k = key(op)
        counts[k] = counts.get(k, 0) + 1
        w = Window(f"{k}#{counts[k]}", op.value["kind"], op.value["target"], op.time_ns, op.wall)
        for later in ops[i + 1:]:
            if gaps and later.process == "monitor" and later.f == "gap":
                w.end_ns, w.end_wall, w.ended_by_gap = later.time_ns, later.wall, True
                break
            if later.process != "nemesis" or key(later) != k:
                continue
            if is_(later, "inject", "begin"):
                break  # taken over: never healed
            if later.value["phase"] == "end" and w.fault_id is None:
                w.fault_id = later.value.get("fault_id")
            if is_(later, "inject", "end") and not later.error:
                w.injected_ns, w.injected_wall = later.time_ns, later.wall
            elif later.f == "inject" and later.value["phase"] in ("end", "refused"):
                w.inject_error = later.error or "refused"
            elif is_(later, "heal", "begin") and w.heal_begin_ns is None:
                w.heal_begin_ns = later.time_ns
            elif is_(later, "heal", "end"):
                w.end_ns, w.end_wall = later.time_ns, later.wall
                w.heal_value, w.heal_error = dict(later.value), later.error
                break
        out.append(w)
    return out


@settings(max_examples=300, deadline=None)
@given(events, st.booleans())
def test_windows_fed_op_by_op_equal_a_reading_of_the_whole_history(evs, gaps):
    ops = build(evs)
    tracker = FaultWindows(gaps=gaps)
    changes = [tracker.feed(op) for op in ops]
    assert tracker.windows == reference(ops, gaps) == fault_windows(ops, gaps=gaps)
    # Open: the latest window of its key, not ended. A change names what its op did.
    for key, w in tracker.open.items():
        assert w.end_ns is None and w is [x for x in tracker.windows if x.key == key][-1]
    for op, ch in zip(ops, changes):
        if ch is None:
            continue
        phase = op.value["phase"]
        if op.f == "inject":
            want = (OPENED if phase == "begin" else
                    INJECTED if phase == "end" and not op.error else INJECT_FAILED)
        else:
            want = HEALING if phase == "begin" else CLOSED
        assert ch.what == want and ch.window.kind == op.value["kind"]


def test_one_fault_window_and_what_each_op_changed():
    v = {"kind": "process_kill", "target": "replica-0"}
    ops = [Op(0, 10, "a", "info", "nemesis", "inject", {**v, "phase": "begin"}),
           Op(1, 20, "b", "info", "nemesis", "inject", {**v, "phase": "end", "fault_id": "f1"}),
           Op(2, 25, "c", "invoke", 3, "completions", {}),
           Op(3, 30, "d", "info", "nemesis", "heal", {**v, "phase": "begin"}),
           Op(4, 40, "e", "info", "nemesis", "heal", {**v, "phase": "end", "restarted": True})]
    tracker = FaultWindows()
    assert [c and c.what for c in map(tracker.feed, ops)] == [
        OPENED, INJECTED, None, HEALING, CLOSED]
    [w] = tracker.windows
    assert (w.label, w.fault_id, w.start_ns, w.injected_ns, w.heal_begin_ns, w.end_ns) == (
        "process_kill@replica-0#1", "f1", 10, 20, 30, 40)
    assert w.heal_value["restarted"] and tracker.last_healed is w and not tracker.open
    assert not tracker.healing


def test_keep_bounds_the_list_not_the_tracking():
    v = {"kind": "packet_loss", "target": "replica-0"}
    tracker = FaultWindows(keep=2)
    for i in range(5):
        tracker.feed(Op(2 * i, i, "w", "info", "nemesis", "inject", {**v, "phase": "begin"}))
        ch = tracker.feed(Op(2 * i + 1, i, "w", "info", "nemesis", "heal", {**v, "phase": "end"}))
        assert ch.what == CLOSED and ch.window.label == f"packet_loss@replica-0#{i + 1}"
    assert [w.label for w in tracker.windows] == ["packet_loss@replica-0#1",
                                                  "packet_loss@replica-0#2"]
    assert tracker.dropped == 3


def test_a_live_tail_gives_the_windows_of_the_finished_file(tmp_path):
    path = tmp_path / "h.jsonl"
    h = History(path, flush_interval=3600, chunk_max_ops=3)
    tail, live = HistoryTail(path), FaultWindows()
    for i in range(40):
        kind, target = KEYS[i % 3]
        f, phase = ACTIONS[(i // 3) % len(ACTIONS)]
        h.append("info", "nemesis", f, {"kind": kind, "target": target, "phase": phase})
        h.append("invoke", i, "completions", {})
        if i % 7 == 0:
            h.append("info", "monitor", "gap", {})
        for op in tail.read_new():
            live.feed(op)
    h.close()
    for op in tail.read_rest():
        live.feed(op)
    whole = fault_windows(read_history(path))
    assert live.windows == whole and len(whole) > 5
