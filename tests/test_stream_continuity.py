"""stream_continuity: a stream cut by a fault ends as fail/info with its
cause, never as ok with fewer tokens; streams lost per kill is a figure.
Histories are written through History with the value shapes the workload
(load/workload.py, load/sse.py) and the nemesis (faults/nemesis.py) record."""

from invariants import DEFAULT_CHECKERS, RunContext, StreamContinuity, with_planted
from invariants.base import check_all
from invariants.stream_continuity import MAX_WINDOW_ROWS
from ordeal.history.ops import NEMESIS
from ordeal.history.reader import read_history
from ordeal.history.writer import History

CTX = RunContext(run_id="t")


class Run:
    def __init__(self, tmp_path):
        self.path = tmp_path / "history.jsonl"
        self.h = History(self.path)
        self.seq = 0

    def invoke(self, max_tokens=300, stream=True, temperature=0.7):
        self.seq += 1
        self.h.append("invoke", self.seq, "completions", {
            "seq": self.seq, "stream": stream, "max_tokens": max_tokens, "prompt": "a b",
            "temperature": temperature, "canary": False, "request_id": f"t-{self.seq}"})
        return self.seq

    def ok(self, p, tokens=300, finish="length", node="replica-0", token_ids=True, usage=True):
        """A streamed ok answer of ``tokens`` tokens, finished with ``finish``."""
        value = {"seq": p, "status": 200, "node": node, "id": f"cmpl-{p}",
                 "finish_reason": finish,
                 "usage": {"prompt_tokens": 2, "completion_tokens": tokens} if usage else None,
                 "output_tokens": tokens, "output_hash": "h",
                 "stream": {"ids": [f"cmpl-{p}"], "finish_reasons": [finish] if finish else [],
                            "done": True, "after_done": 0, "errors": [], "malformed": [],
                            "n_chunks": tokens,
                            "n_token_ids": tokens if token_ids else None,
                            "sequence_problems": [], "seq_chunks": tokens, "chunks": []}}
        return self.h.append("ok", p, "completions", value)

    def cut(self, p, type="info", error="connection lost: ClientPayloadError: cut",
            node="replica-1", tokens=40):
        """A stream cut mid-way (no [DONE]), as send_request records it."""
        value = {"seq": p, "status": 200, "node": node,
                 "stream": {"ids": [f"cmpl-{p}"], "finish_reasons": [], "done": False,
                            "after_done": 0, "errors": [], "malformed": [],
                            "n_chunks": tokens, "n_token_ids": tokens,
                            "sequence_problems": [], "seq_chunks": tokens, "chunks": []}}
        return self.h.append(type, p, "completions", value, error)

    def inject(self, kind="process_kill", target="replica-1", error=None):
        v = {"kind": kind, "target": target}
        begin = self.h.append("info", NEMESIS, "inject", {**v, "phase": "begin"})
        self.h.append("info", NEMESIS, "inject", {**v, "fault_id": "f", "phase": "end"}, error)
        return begin

    def heal(self, kind="process_kill", target="replica-1"):
        v = {"kind": kind, "target": target}
        self.h.append("info", NEMESIS, "heal", {**v, "phase": "begin"})
        self.h.append("info", NEMESIS, "heal", {**v, "restarted": True, "phase": "end"})

    def ops(self):
        self.h.close()
        return list(read_history(self.path))


def judge(ops):
    return StreamContinuity().check(ops, CTX)


def test_clean_history_is_valid_and_a_short_stop_is_fine(tmp_path):
    run = Run(tmp_path)
    for _ in range(3):
        run.ok(run.invoke())
    run.ok(run.invoke(max_tokens=300), tokens=120, finish="stop")  # the model ended it
    run.ok(run.invoke(), finish="length", token_ids=False)  # counted by usage
    run.h.append("ok", run.invoke(stream=False), "completions", {"seq": 9, "status": 200})
    r = judge(run.ops())
    assert r.valid is True, r.to_dict()
    d = r.details
    assert d["streams"] == d["ok_streams"] == 5 and d["short_stop"] == 1
    assert d["truncated_ok"] == d["non_ok_without_cause"] == 0 and r.counterexamples == []
    assert d["kills"] == 0 and d["streams_lost_per_kill"] is None


def test_ok_but_truncated_is_caught_with_its_counterexample(tmp_path):
    run = Run(tmp_path)
    run.ok(run.invoke())
    bad = run.ok(run.invoke(max_tokens=300), tokens=137, finish="length", node="replica-1")
    nofinish = run.ok(run.invoke(max_tokens=300), tokens=12, finish=None)
    r = judge(run.ops())
    assert r.valid is False
    assert r.details["truncated_ok"] == 2
    cx = r.counterexamples[0]
    assert cx["index"] == bad.index and cx["tokens_seen"] == 137 and cx["max_tokens"] == 300
    assert cx["finish_reason"] == "length" and cx["node"] == "replica-1"
    assert cx["counted_by"] == "token_ids" and "ok but truncated" in cx["problem"]
    assert r.counterexamples[1]["index"] == nofinish.index
    assert r.counterexamples[1]["finish_reason"] is None


def test_tokens_that_cannot_be_counted_are_not_judged(tmp_path):
    run = Run(tmp_path)
    run.ok(run.invoke(), tokens=10, token_ids=False, usage=False)
    r = judge(run.ops())
    assert r.valid is True and r.details["uncounted"] == 1


def test_a_failure_without_its_cause_is_caught(tmp_path):
    run = Run(tmp_path)
    run.cut(run.invoke())  # has its cause: fine
    run.cut(run.invoke(), type="fail", error="error event in stream: boom")
    silent = run.cut(run.invoke(), type="info", error=None)
    blank = run.cut(run.invoke(), type="fail", error="  ")
    r = judge(run.ops())
    assert r.valid is False
    assert r.details["non_ok_without_cause"] == 2 and r.details["non_ok_streams"] == 4
    assert [c["index"] for c in r.counterexamples] == [silent.index, blank.index]
    assert "without a cause" in r.counterexamples[0]["problem"]


def test_streams_lost_per_kill_over_two_kill_windows(tmp_path):
    run = Run(tmp_path)
    run.ok(run.invoke())  # before any fault: in flight at none
    # Kill 1: three streams in flight; two are cut on the victim, one ends ok.
    a, b, c = run.invoke(), run.invoke(), run.invoke(temperature=0.0)
    run.inject()
    late = run.invoke()  # invoked after the inject: not in flight at it
    run.cut(a)
    run.cut(b, type="fail", error="error event in stream: engine dead", node="replica-0")
    run.ok(c, node="replica-0")
    run.ok(late, node="replica-0")
    run.heal()
    # A latency window that cut one stream: a fault, not a kill.
    d = run.invoke()
    run.inject("network_latency", "router-replica-0")
    run.cut(d, error="timeout after 120s waiting for the stream")
    run.heal("network_latency", "router-replica-0")
    # Kill 2: two streams in flight, both cut.
    e, f = run.invoke(), run.invoke()
    run.inject()
    run.cut(e)
    run.cut(f)
    run.heal()
    r = judge(run.ops())
    assert r.valid is True, r.to_dict()
    dt = r.details
    assert dt["kills"] == 2
    assert dt["streams_in_flight_at_kills"] == 5 and dt["streams_lost_at_kills"] == 4
    assert dt["streams_in_flight_per_kill"] == 2.5 and dt["streams_lost_per_kill"] == 2.0
    assert dt["in_flight_at_faults"] == 6 and dt["lost_at_faults"] == 5
    assert dt["by_kind"]["process_kill"] == {"windows": 2, "inject_failed": 0, "in_flight": 5,
                                             "lost": 4, "lost_on_target": 3}
    assert dt["windows"]["process_kill@replica-1#1"]["in_flight"] == 3
    assert dt["windows"]["process_kill@replica-1#1"]["lost"] == 2
    assert dt["windows"]["process_kill@replica-1#2"]["lost"] == 2
    assert dt["windows"]["network_latency@router-replica-0#1"]["lost"] == 1
    assert dt["greedy_survivors_of_kills"] == 1  # c: greedy, in flight at kill 1, ok


def test_a_kill_whose_inject_failed_is_counted_and_said(tmp_path):
    run = Run(tmp_path)
    a = run.invoke()
    run.inject(error="RuntimeError: 1 still run 15 s after SIGKILL")
    run.cut(a)
    run.heal()
    r = judge(run.ops())
    assert r.details["kills"] == 1 and r.details["streams_lost_per_kill"] == 1.0
    assert r.details["kills_inject_failed"] == 1
    assert r.details["by_kind"]["process_kill"]["inject_failed"] == 1
    assert r.details["windows"]["process_kill@replica-1#1"]["inject_failed"] is True


def test_no_stream_is_unknown_and_gap_closed_streams_are_not_judged(tmp_path):
    run = Run(tmp_path)
    run.h.append("ok", run.invoke(stream=False), "completions", {"seq": 1, "status": 200})
    p = run.invoke()
    run.h.append("info", p, "completions", {"gap": True}, None)
    r = judge(run.ops())
    assert r.valid == "unknown" and "no streamed request" in r.details["why"]
    assert r.details["gap_closed"] == 1
    assert judge([]).valid == "unknown"


def test_memory_is_bounded_by_window_rows_not_run_length(tmp_path):
    run = Run(tmp_path)
    n = MAX_WINDOW_ROWS + 10
    for _ in range(n):
        p = run.invoke()
        run.inject()
        run.cut(p)
        run.heal()
    checker = StreamContinuity()
    r = checker.check(run.ops(), CTX)
    assert len(r.details["windows"]) == MAX_WINDOW_ROWS
    assert r.details["kills"] == n and r.details["streams_lost_per_kill"] == 1.0
    assert checker.flights == {} and len(checker.faults.windows) == 0


def test_planted_truncation_is_withdrawn_not_judged(tmp_path):
    run = Run(tmp_path)
    run.ok(run.invoke())
    p = run.invoke()
    run.inject("lsn_jump", "client-router")
    run.ok(p, tokens=250)  # an event dropped on purpose: short, finish length
    run.heal("lsn_jump", "client-router")
    ops = run.ops()
    assert judge(ops).valid is False  # control: alone it is a truncated ok stream
    r = {x.name: x for x in check_all(with_planted([StreamContinuity()]), ops, CTX)}
    sc = r["stream_continuity"]
    assert sc.valid is True and sc.details["excluded_planted"] == 1
    assert sc.details["withdrawn"] == 1 and sc.details["lost_at_faults"] == 0


def test_registered_for_vllm_and_left_out_of_triton():
    from engines.triton.adapter import TritonEngine
    from engines.vllm.adapter import VllmEngine

    assert StreamContinuity in DEFAULT_CHECKERS
    assert "stream_continuity" in {c.name for c in VllmEngine().checkers()}
    assert "stream_continuity" not in {c.name for c in TritonEngine().checkers()}
