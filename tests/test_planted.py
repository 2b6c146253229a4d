"""Planted corruption (lsn_jump) is judged as detection: requests that met a
planted window are hidden from the stream checkers and must instead have been
caught; everything else is judged as usual."""

from invariants import (
    CanaryDeterminism,
    ExcludingPlanted,
    NoSilentLoss,
    PlantedDetected,
    RunContext,
    StreamWellFormed,
    UsageMatchesTokens,
    with_planted,
)
from invariants.base import check_all
from ordeal.history.ops import NEMESIS
from ordeal.history.reader import read_history
from ordeal.history.writer import History

CTX = RunContext(run_id="t")
MEANT = ("stream_wellformed", "usage_matches_tokens", "canary_determinism")


class Run:
    """Writes a history through History with the value shapes the workload
    (load/workload.py, load/sse.py) and the nemesis (faults/nemesis.py)
    record."""

    def __init__(self, tmp_path):
        self.path = tmp_path / "history.jsonl"
        self.h = History(self.path)
        self.seq = 0
        self.fault_ids = 0

    def invoke(self, canary=False, prompt="alpha beta", max_tokens=8):
        self.seq += 1
        self.h.append("invoke", self.seq, "completions", {
            "seq": self.seq, "stream": True, "max_tokens": max_tokens, "prompt": prompt,
            "temperature": 0.0, "canary": canary, "request_id": f"ordeal-test-{self.seq}"})
        return self.seq

    def done(self, p, corrupt=False, text="one two three four five six seven eight",
             canary=False, stream=True, max_tokens=8, node="replica-0"):
        """A streamed ``ok`` answer of ``max_tokens`` tokens; ``corrupt``: one
        event duplicated in flight (as lsn_jump mode=duplicate does), seen as a
        repeat of the running token count and one token id too many."""
        n = max_tokens
        words = text.split()
        chunks = [" " + words[i % len(words)] for i in range(n)]  # each event's text
        seq_problems = []
        if corrupt:
            chunks.insert(3, chunks[2])
            seq_problems = ["completion_tokens repeated: 3 after 3"]
        value = {"seq": p, "status": 200, "node": node, "id": f"cmpl-{p}",
                 "finish_reason": "length",
                 "usage": {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2},
                 "output_tokens": n, "output_hash": "h", "fingerprint": None,
                 "created": 1767225600, "e2e_ms": 30.0, "ttft_ms": 10.0,
                 "itl_ms": [1.0] * (len(chunks) - 1), "tpot_ms": 1.0,
                 "stream": {"ids": [f"cmpl-{p}"], "finish_reasons": ["length"], "done": True,
                            "after_done": 0, "errors": [], "malformed": [],
                            "n_chunks": len(chunks), "n_token_ids": len(chunks),
                            "sequence_problems": seq_problems, "seq_chunks": len(chunks),
                            "texts": chunks} if stream else None}
        if not stream:
            del value["stream"]
        if canary:
            value["text"] = "".join(chunks)
            value["token_ids"] = list(range(len(chunks)))
        return self.h.append("ok", p, "completions", value)

    def request(self, corrupt=False, canary=False, **kw):
        return self.done(self.invoke(canary=canary), corrupt=corrupt, canary=canary, **kw)

    def inject(self, kind="lsn_jump", target="client-router"):
        self.fault_ids += 1
        v = {"kind": kind, "target": target}
        begin = self.h.append("info", NEMESIS, "inject", {**v, "phase": "begin"})
        self.h.append("info", NEMESIS, "inject", {
            **v, "fault_id": f"f{self.fault_ids}", "link": target,
            "toxics": [{"toxic": "t", "type": "sse_duplicate", "direction": "downstream",
                        "toxicity": 1.0, "after_events": 2, "count": 1}], "phase": "end"})
        return begin

    def heal(self, kind="lsn_jump", target="client-router"):
        v = {"kind": kind, "target": target}
        self.h.append("info", NEMESIS, "heal", {**v, "phase": "begin"})
        self.h.append("info", NEMESIS, "heal", {**v, "fault_id": f"f{self.fault_ids}",
                                                "removed": 1, "already_gone": 0,
                                                "phase": "end"})

    def ops(self):
        self.h.close()
        return list(read_history(self.path))


def judge(ops, planted=True):
    checkers = [NoSilentLoss(), StreamWellFormed(), UsageMatchesTokens(), CanaryDeterminism()]
    if planted:
        checkers = with_planted(checkers)
    return {r.name: r for r in check_all(checkers, ops, CTX)}


def test_corruption_inside_an_lsn_jump_window_is_detection_not_a_defect(tmp_path):
    run = Run(tmp_path)
    run.request(canary=True)  # the golden answer
    run.request()
    run.inject()
    bad = run.request(corrupt=True)
    bad_canary = run.request(corrupt=True, canary=True)
    run.heal()
    run.request(canary=True)
    ops = run.ops()

    plain = judge(ops, planted=False)  # control: without the split all three fail
    assert [plain[n].valid for n in MEANT] == [False, False, False]

    r = judge(ops)
    for name in MEANT:
        assert r[name].valid is True, (name, r[name].details, r[name].counterexamples)
        assert r[name].details["excluded_planted"] == 2
    assert r["stream_wellformed"].details["ok_streams"] == 3
    assert r["canary_determinism"].details["matched"] == 1
    d = r["planted_detected"]
    assert d.valid is True, d.to_dict()
    w = d.details["windows"]["lsn_jump@client-router#1"]
    assert w["streamed"] == 2 and w["caught"] == 2 and w["healed"] is True
    assert w["first_caught"]["index"] == bad.index
    assert any("token ids" in p for p in w["first_caught"]["problems"])
    assert w["first_caught"]["index"] < bad_canary.index


def test_the_same_corruption_outside_a_planted_window_is_still_caught(tmp_path):
    run = Run(tmp_path)
    run.request()
    run.inject("network_latency", "client-router")  # a fault, but not a planted one
    outside = run.request(corrupt=True)
    run.heal("network_latency", "client-router")
    run.inject()
    run.request(corrupt=True)
    run.heal()
    r = judge(run.ops())
    for name in ("stream_wellformed", "usage_matches_tokens"):
        assert r[name].valid is False, r[name].details
        assert [c["index"] for c in r[name].counterexamples] == [outside.index]
        assert r[name].details["excluded_planted"] == 1
    assert r["planted_detected"].valid is True


def test_a_planted_window_whose_streams_all_look_clean_is_a_miss(tmp_path):
    run = Run(tmp_path)
    run.inject()
    run.request()  # toxics in place, yet no corruption seen: probe or checker broken
    run.request()
    run.heal()
    run.request()
    first_missed = run.inject("lsn_jump", "router-replica-0")
    run.request()
    run.heal("lsn_jump", "router-replica-0")
    run.inject()  # a later window that did bite
    run.request(corrupt=True)
    run.heal()
    r = judge(run.ops())
    d = r["planted_detected"]
    assert d.valid is False, d.to_dict()
    assert d.details["undetected"] == 2
    ce = d.counterexamples
    assert [c["window"] for c in ce] == ["lsn_jump@client-router#1",
                                         "lsn_jump@router-replica-0#1"]
    assert ce[1]["kind"] == "lsn_jump" and ce[1]["target"] == "router-replica-0"
    assert ce[1]["begin_wall"] == first_missed.wall and ce[0]["streamed"] == 2
    assert d.details["windows"]["lsn_jump@client-router#2"]["caught"] == 1
    # Hidden from the stream checkers all the same.
    assert r["stream_wellformed"].valid is True


def test_a_planted_window_no_stream_met_is_unknown(tmp_path):
    run = Run(tmp_path)
    run.request()
    run.inject()
    run.request(stream=False)  # not streamed: nothing for lsn_jump to corrupt
    run.heal()
    run.inject()  # no request at all
    run.heal()
    r = judge(run.ops())
    d = r["planted_detected"]
    assert d.valid == "unknown", d.to_dict()
    assert d.details["planted_windows"] == 2 and d.details["excluded"] == 1


def test_overlap_is_judged_on_the_whole_lifetime(tmp_path):
    run = Run(tmp_path)
    before = run.done(run.invoke(), corrupt=True)  # ended before the window began: judged
    into = run.invoke()
    across = run.invoke()
    run.inject()
    run.done(into, corrupt=True)  # began before, ended inside: excluded
    run.heal("lsn_jump", "router-replica-0")  # another target's heal closes nothing
    run.request(corrupt=True)  # began and ended inside: excluded
    out_of = run.invoke()
    run.heal()
    run.done(out_of, corrupt=True)  # began inside, ended after the heal: excluded
    run.done(across, corrupt=True)  # began before, ended after: excluded
    after = run.request(corrupt=True)  # began after the heal: judged
    r = judge(run.ops())
    sw = r["stream_wellformed"]
    assert sorted(c["index"] for c in sw.counterexamples) == [before.index, after.index]
    assert sw.details["excluded_planted"] == 4
    d = r["planted_detected"]
    assert d.valid is True and d.details["windows"]["lsn_jump@client-router#1"]["streamed"] == 4


def test_only_requests_exposed_to_the_toxics_can_make_a_miss(tmp_path):
    """A clean stream that began before the toxics were in place, or went
    through another replica's link, proves nothing about detection; one sent
    while they were in place through the faulted link does."""
    run = Run(tmp_path)
    early = run.invoke()  # streaming before the inject: the proxy leaves it alone
    run.inject()
    run.done(early)
    run.heal()
    run.inject("lsn_jump", "router-replica-1")
    run.request(node="replica-0")  # routed to the other replica
    run.heal("lsn_jump", "router-replica-1")
    r = judge(run.ops())
    d = r["planted_detected"]
    assert d.valid == "unknown", d.to_dict()
    w1 = d.details["windows"]["lsn_jump@client-router#1"]
    assert (w1["streamed"], w1["exposed"]) == (1, 0)
    assert "in place" in w1["why_not_judged"]
    w2 = d.details["windows"]["lsn_jump@router-replica-1#1"]
    assert (w2["streamed"], w2["exposed"]) == (1, 0)
    assert "served by replica-1" in w2["why_not_judged"]

    run = Run(tmp_path / "b")
    run.inject("lsn_jump", "router-replica-1")
    run.request(node="replica-1")  # through the faulted link, and clean: a miss
    run.heal("lsn_jump", "router-replica-1")
    d = judge(run.ops())["planted_detected"]
    assert d.valid is False and d.counterexamples[0]["exposed"] == 1, d.to_dict()


def test_no_planted_fault_is_a_pass_with_a_note(tmp_path):
    run = Run(tmp_path)
    run.request()
    run.inject("process_kill", "replica-1")
    run.request()
    run.heal("process_kill", "replica-1")
    r = judge(run.ops())
    d = r["planted_detected"]
    assert d.valid is True and d.details["why"] == "no planted fault in this run"
    assert d.details["planted_windows"] == 0
    assert r["stream_wellformed"].details["excluded_planted"] == 0


def test_open_request_state_is_dropped_at_completion(tmp_path):
    """Open loop: every request has its own process, so any per-request
    state left behind would grow with the run."""
    run = Run(tmp_path)
    in_flight = []
    for i in range(600):
        if i == 200:
            run.inject()
        if i == 400:
            run.heal()
        in_flight.append(run.invoke(canary=i % 3 == 0))
        if len(in_flight) == 4:
            p = in_flight.pop(0)
            run.done(p, corrupt=200 <= i < 400, canary=p % 3 == 1)
    for p in in_flight:
        run.done(p, canary=p % 3 == 1)
    usage, canaries = UsageMatchesTokens(), CanaryDeterminism()
    wrapped = [ExcludingPlanted(usage), ExcludingPlanted(canaries)]
    detected = PlantedDetected()
    for c in (*wrapped, detected):
        c.start(CTX)
    peak = 0
    for op in run.ops():
        for c in (*wrapped, detected):
            c.feed(op)
            peak = max(peak, len(c.windows.inflight))
    assert peak == 4
    for c in (*wrapped, detected):
        assert c.windows.inflight == {}
    assert usage.max_tokens == {} and canaries.prompts == {}
    assert wrapped[0].result().details["excluded_planted"] == 203
    assert wrapped[0].result().valid is True and detected.result().valid is True


def test_an_excluded_request_leaves_no_trace_in_the_inner_verdict(tmp_path):
    run = Run(tmp_path)
    run.inject()
    run.request(corrupt=True, canary=True)
    run.request(corrupt=True)
    run.heal()
    ops = run.ops()
    for make in (StreamWellFormed, UsageMatchesTokens, CanaryDeterminism):
        alone = make().check([o for o in ops if o.process == NEMESIS], CTX)
        hidden = ExcludingPlanted(make()).check(ops, CTX)
        assert hidden.name == alone.name
        assert hidden.valid == alone.valid == "unknown"
        assert hidden.details == {**alone.details, "excluded_planted": 2}


def test_with_planted_wraps_only_the_meant_checkers_once():
    loss = NoSilentLoss()
    out = with_planted([loss, StreamWellFormed(), UsageMatchesTokens(), CanaryDeterminism()])
    assert out[0] is loss
    assert [type(c).__name__ for c in out[1:]] == ["ExcludingPlanted"] * 3 + ["PlantedDetected"]
    assert [c.name for c in out] == ["no_silent_loss", *MEANT, "planted_detected"]
    again = with_planted(out)  # idempotent: nothing wrapped twice, one detector
    assert len(again) == len(out) and all(a is b for a, b in zip(again, out))
