"""The phase arithmetic (steady / fault window / after heal) of the streaming
Timeline against a plain reference that sees every window at once."""

from hypothesis import given, settings
from hypothesis import strategies as st

from invariants.requests import STEADY, Timeline, paired_requests
from ordeal.history.ops import Op

UNIT = 100_000_000  # 0.1 s
KEYS = [("process_kill", "replica-0"), ("process_kill", "replica-1"), ("network_latency", "link")]

# An event: (gap in ms before it, what): "req", or an index into KEYS to toggle
# (inject if healed, heal if injected).
events = st.lists(st.tuples(st.integers(1, 20),
                            st.one_of(st.just("req"), st.just("done"),
                                      st.integers(0, len(KEYS) - 1))),
                  max_size=60)


def build(evs):
    ops, t, open_keys, proc, in_flight = [], 0, set(), 0, []
    for gap, what in evs:
        t += gap * UNIT  # coarse steps, so boundaries (t - heal == after) really occur
        if what == "req":  # a request starts; it ends at a later "done" (or the end)
            proc += 1
            in_flight.append(proc)
            ops.append(Op(len(ops), t, "w", "invoke", proc, "completions", {}))
            continue
        if what == "done":
            if in_flight:
                ops.append(Op(len(ops), t, "w", "ok", in_flight.pop(0), "completions", {}))
            continue
        kind, target = KEYS[what]
        f = "heal" if what in open_keys else "inject"
        open_keys.symmetric_difference_update({what})
        for phase in ("begin", "end"):
            ops.append(Op(len(ops), t, "w", "info", "nemesis", f,
                          {"kind": kind, "target": target, "phase": phase}))
    for p in in_flight:
        ops.append(Op(len(ops), t, "w", "ok", p, "completions", {}))
    return ops


def reference(ops, after_ns):
    """Windows from the whole history, then each request looked up plainly."""
    windows, open_by_key, counts = [], {}, {}
    for op in ops:
        if op.process != "nemesis":
            continue
        key = f"{op.value['kind']}@{op.value['target']}"
        if op.f == "inject" and op.value["phase"] == "begin":
            counts[key] = counts.get(key, 0) + 1
            w = {"label": f"{key}#{counts[key]}", "begin": op.time_ns, "end": None}
            windows.append(w)
            open_by_key[key] = w
        elif op.f == "heal" and op.value["phase"] == "end":
            open_by_key.pop(key)["end"] = op.time_ns
    out = []
    done_at = {op.process: op.index for op in ops if op.type not in ("invoke",)
               and op.process != "nemesis"}
    begins = [(op.index, w) for op, w in zip(
        [o for o in ops if o.process == "nemesis" and o.f == "inject"
         and o.value["phase"] == "begin"], windows)]
    for op in ops:
        if op.type != "invoke":
            continue
        # A fault that began while the request was in flight is the one it met.
        met = [w for i, w in begins if op.index < i < done_at[op.process]]
        if met:
            out.append(("fault", met[-1]["label"]))
            continue
        t = op.time_ns
        active = [w for w in windows if w["begin"] <= t and (w["end"] is None or t < w["end"])]
        if active:
            out.append(("fault", max(active, key=lambda w: w["begin"])["label"]))
            continue
        healed = [w for w in windows if w["end"] is not None and w["end"] <= t]
        last = max(healed, key=lambda w: w["end"], default=None)
        if last is not None and t - last["end"] <= after_ns:
            out.append(("after_heal", last["label"]))
        else:
            out.append((STEADY, STEADY))
    return out


@settings(max_examples=300, deadline=None)
@given(events, st.integers(0, 40))
def test_streaming_phases_equal_the_plain_reference(evs, after_units):
    ops = build(evs)
    got = [(r.phase, r.window) for r in paired_requests(ops, Timeline(after_units * UNIT / 1e9))]
    assert got == reference(ops, after_units * UNIT)
