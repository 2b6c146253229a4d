"""Known findings (--known-findings): a failure a listed finding covers is
reported as known and left out of the verdict; anything else still fails;
a listed finding that did not occur under its fault is reported.

The real evidence: tests/data/vllm-router-pause-partition.ops.jsonl.gz is
the client and nemesis ops of a real nemesis smoke on the embedded stack
(vLLM 0.32.0 behind vllm-router 0.1.17, 2026-12-02), in which the router
kept sending to a paused and to a cut-off replica for ~6 s. With the file
shipped for that stack the run passes; without one of its findings it fails.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from invariants import Failover, FaultSLO, NoDuplicateExecution, NoOrphans, RunContext
from invariants.failover import MAX_WINDOW_ROWS
from invariants.known import (
    SHIPPED_DIR,
    KnownFinding,
    KnownFindings,
    embedded_file,
    read_known_findings,
)
from ordeal.config import ConfigError
from ordeal.history.ops import NEMESIS, Op
from reports.findings import bounds_text, findings_of
from reports.html import section_findings, section_invariants
from reports.summary import build_summary

DATA = Path(__file__).resolve().parent / "data" / "vllm-router-pause-partition.ops.jsonl.gz"
SHIPPED = SHIPPED_DIR / "vllm-0.32.0+vllm-router-0.1.17.toml"
FINGERPRINTS = ["vllm-0.32.0-24dfa6e6", "vllm-0.32.0-24dfa6e6", "vllm-router-0.1.17"]


def write(tmp_path, text):
    p = tmp_path / "known.toml"
    p.write_text(text)
    return p


FINDING = '''[[finding]]
invariant = "failover"
fault = "process_pause"
target = "replica-*"
max_ejection_s = 9.0
reason = "the router keeps sending to a paused replica"
tracked = "TICKET-1"
'''


# -- the file ------------------------------------------------------------------------------------

def test_a_good_file_is_read_with_its_digest(tmp_path):
    known = read_known_findings(write(tmp_path, FINDING))
    assert known.findings == (KnownFinding("failover", "the router keeps sending to a paused "
                                           "replica", "TICKET-1", "process_pause", "replica-*",
                                           {"max_ejection_s": 9.0}),)
    assert len(known.sha256) == 12


@pytest.mark.parametrize("text, error", [
    (FINDING.replace('reason = "the router keeps sending to a paused replica"\n', ""),
     "finding 1: reason is required"),
    (FINDING.replace('invariant = "failover"', 'invariant = "failovr"'),
     "no invariant 'failovr'; known: .*failover"),
    (FINDING + 'severity = "high"\n', r"unknown key\(s\) \['severity'\]"),
    (FINDING.replace('target = "replica-*"', 'target = ""'), "target must be a non-empty"),
    ("[finding]\ninvariant = 1\n", "write it as a \\[\\[finding\\]\\] table|invariant is required"),
    ("[[finding]\n", "not TOML"),
    ("[other]\n", r"unknown top-level key\(s\) \['other'\]"),
])
def test_a_bad_file_is_refused_with_what_is_wrong(tmp_path, text, error):
    with pytest.raises(ConfigError, match=error):
        read_known_findings(write(tmp_path, text))


def test_a_missing_file_says_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match="no such file.*leave --known-findings out"):
        read_known_findings(tmp_path / "nope.toml")


def test_the_shipped_file_is_found_for_its_stack_only():
    assert embedded_file(FINGERPRINTS) == SHIPPED
    assert embedded_file(["vllm-0.33.0-aa", "vllm-router-0.1.17"]) is None
    assert embedded_file(["triton-2.51.0+models-x", "haproxy-2.6"]) is None
    assert read_known_findings(SHIPPED).findings  # it reads, and names real invariants


# -- applying it -------------------------------------------------------------------------------

def failed(*windows):
    return {"name": "failover", "valid": False, "details": {},
            "counterexamples": [{"problem": "late", "window": w} for w in windows]}


def known_of(*findings):
    return KnownFindings("k.toml", "d", tuple(findings))


PAUSE = KnownFinding("failover", "paused", "T-1", "process_pause", "replica-*")


def summary(invariants):
    return build_summary(run_id="r", suite="s", started="", ended="", cluster={}, counts={},
                         nemesis_counts={}, faults=[], invariants=invariants, workload={})


def test_a_failure_wholly_covered_is_known_and_out_of_the_verdict():
    invs = [failed("process_pause@replica-1#1", "process_pause@replica-1#1"),
            {"name": "goodput", "valid": True, "details": {}, "counterexamples": []}]
    out = known_of(PAUSE).apply(invs, [{"kind": "process_pause", "target": "replica-1"}])
    assert invs[0]["known"][0]["tracked"] == "T-1" and invs[0]["valid"] is False
    assert out["matched"] == [{**PAUSE.describe(), "violations": 2, "measured": {}}]
    assert out["not_seen"] == []
    assert summary(invs)["verdict"] == "pass"


def test_one_counterexample_outside_the_list_keeps_it_failing():
    invs = [failed("process_pause@replica-1#1", "network_partition@replica-1#1")]
    out = known_of(PAUSE).apply(invs, [])
    assert "known" not in invs[0] and out["matched"] == []
    assert summary(invs)["verdict"] == "fail"


def test_a_listed_finding_that_did_not_occur_under_its_fault_is_reported():
    invs = [{"name": "failover", "valid": True, "details": {}, "counterexamples": []}]
    out = known_of(PAUSE).apply(invs, [{"kind": "process_pause", "target": "replica-0"}])
    assert [f["reason"] for f in out["not_seen"]] == ["paused"]
    assert "remove it from the file" in out["not_seen"][0]["why"]
    # Its fault was not injected in this run: nothing to say.
    assert known_of(PAUSE).apply(invs, [{"kind": "process_kill",
                                         "target": "replica-0"}])["not_seen"] == []


def test_a_failed_invariant_it_does_not_cover_is_never_said_to_have_held():
    """Found by the 72 h at x72 run: failover failed with violations the
    file could not match, and the summary said "the invariant held"."""
    invs = [failed("process_pause@replica-1#1", "network_partition@replica-1#1")]
    out = known_of(PAUSE).apply(invs, [{"kind": "process_pause", "target": "replica-1"}])
    assert out["not_seen"] == [] and out["matched"] == []
    assert summary(invs)["verdict"] == "fail"


def test_a_finding_whose_fault_stayed_in_bounds_beside_a_known_one_is_not_seen():
    """Pause and partition both listed and injected, every violation in a
    pause window: failover is known, and the partition finding did not occur."""
    cut = KnownFinding("failover", "cut off", "T-2", "network_partition", "*replica-*")
    invs = [failed("process_pause@replica-1#1", "process_pause@replica-1#2")]
    out = known_of(PAUSE, cut).apply(invs, [{"kind": "process_pause", "target": "replica-1"},
                                            {"kind": "network_partition",
                                             "target": "replica-1"}])
    assert invs[0]["known"] and summary(invs)["verdict"] == "pass"
    [entry] = out["not_seen"]
    assert entry["reason"] == "cut off" and "none of the invariant's violations" in entry["why"]


# -- on the real run's evidence -----------------------------------------------------------------

def real_ops() -> list[Op]:
    with gzip.open(DATA, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [Op(i, t, wall, type_, process, f_, value, error)
            for i, (t, wall, type_, process, f_, value, error) in enumerate(rows)]


def faults_of(ops):
    return [{"kind": o.value["kind"], "target": o.value["target"]} for o in ops
            if o.process == "nemesis" and o.f == "inject" and o.value.get("phase") == "begin"]


def without(text: str, invariant: str, fault: str) -> str:
    """The findings file less the [[finding]] of ``invariant`` under ``fault``."""
    blocks = text.split("[[finding]]")
    kept = [b for b in blocks[1:]
            if not (f'invariant = "{invariant}"' in b and f'fault = "{fault}"' in b)]
    assert len(kept) == len(blocks) - 2, f"no single {invariant}/{fault} finding"
    return blocks[0] + "".join("[[finding]]" + b for b in kept)


def test_the_real_smoke_passes_with_the_shipped_file_and_fails_without_a_finding(tmp_path):
    ops = real_ops()
    results = [c.check(ops, RunContext(run_id="real")).to_dict()
               for c in (Failover(), FaultSLO())]
    by_name = {r["name"]: r for r in results}
    assert by_name["failover"]["valid"] is False
    assert by_name["failover"]["details"]["max_ejection_s"] > 5
    shipped = read_known_findings(SHIPPED)

    invs = json.loads(json.dumps(results))
    out = shipped.apply(invs, faults_of(ops))
    assert all(i["valid"] is True or i.get("known") for i in invs), out
    assert summary(invs)["verdict"] == "pass", out

    # Each finding the run needs, removed, makes it fail again.
    for name in ("failover", "fault_slo"):
        if by_name[name]["valid"] is True:
            continue  # this run's windows happened to meet it
        text = without(SHIPPED.read_text(), name, "network_partition")
        invs = json.loads(json.dumps(results))
        read_known_findings(write(tmp_path, text)).apply(invs, faults_of(ops))
        [inv] = [i for i in invs if i["name"] == name]
        assert "known" not in inv and summary(invs)["verdict"] == "fail", name

# -- a known finding has a size (issue 39) -----------------------------------------------------
# "Ejects after about 6 s" excuses 6 s, not 60: each finding carries bounds on
# the figures its invariant measures per window, and a window beyond them is
# a new finding. The planted runs below go through the real checkers.

class Planted:
    """Ops at chosen times (seconds), in the shapes the workload, the
    nemesis and the monitor record (as tests/test_failover.py plants them)."""

    def __init__(self):
        self.ops: list[Op] = []
        self.proc = 0

    def _op(self, t, type, process, f, value, error=None):
        self.ops.append(Op(0, int(t * 1e9), "2026-12-02T00:00:00.000Z", type, process, f,
                           value, error))

    def request(self, at, done, node):
        self.proc += 1
        self._op(at, "invoke", self.proc, "completions", {"seq": self.proc, "stream": True})
        ms = (done - at) * 1000
        self._op(done, "ok", self.proc, "completions",
                 {"seq": self.proc, "node": node, "ttft_ms": ms, "e2e_ms": ms, "tpot_ms": 20.0})

    def steady(self, start, end, node="replica-0", every=0.5):
        t = start
        while t < end:
            self.request(t, t + 0.2, node)
            t += every

    def fault(self, at, healed, kind="process_pause", target="replica-1", heal=None):
        v = {"kind": kind, "target": target}
        for t, f, phase, extra in ((at, "inject", "begin", {}), (at, "inject", "end", {}),
                                   (healed, "heal", "begin", {}),
                                   (healed, "heal", "end", heal or {})):
            self._op(t, "info", NEMESIS, f, {**v, **extra, "phase": phase})

    def served(self, t, node, *rids):
        self._op(t, "info", "monitor", "served",
                 {"node": node, "entries": [[r, 200, True] for r in rids]})

    def judge(self, *checkers):
        ops = sorted(self.ops, key=lambda o: o.time_ns)
        ops = [replace(o, index=i) for i, o in enumerate(ops)]
        faults = [{"kind": o.value["kind"], "target": o.value["target"]} for o in ops
                  if o.process == NEMESIS and o.f == "inject" and o.value["phase"] == "begin"]
        return [c.check(ops, RunContext(run_id="t")).to_dict() for c in checkers], faults


def pause(last_send, heal=22.0, readmit=True):
    """replica-1 paused from 10 s to ``heal``; the router sends it a request
    every 0.5 s from 10.5 s to ``last_send`` (each answered after the heal),
    the rest to replica-0; after the heal replica-1 is taken back (or not,
    with ``readmit=False``, while the load runs on 38 s)."""
    p = Planted()
    p.steady(0, heal + (38 if not readmit else 8))
    p.fault(10, heal)
    t = 10.5
    while t <= last_send + 1e-9:
        p.request(t, heal + 0.1, "replica-1")
        t += 0.5
    if readmit:
        p.request(heal + 1, heal + 1.2, "replica-1")
    return p.judge(Failover(), FaultSLO())


def never_ejects():
    """The issue's router: it never ejects the paused replica (a request a
    second to it for the whole 60 s pause: 59.5 s of sends, 55 after the
    failover bound)."""
    p = Planted()
    p.steady(0, 80)
    p.fault(10, 70)
    for i in range(60):
        p.request(10.5 + i, 70.1, "replica-1")
    p.request(71, 71.2, "replica-1")
    return p.judge(Failover(), FaultSLO())


def named(invs, name):
    [inv] = [i for i in invs if i["name"] == name]
    return inv


def test_a_router_that_never_ejects_is_a_new_finding_even_with_the_shipped_file():
    invs, faults = never_ejects()
    fo = named(invs, "failover")
    assert fo["valid"] is False and fo["details"]["sent_after_bound"] == 55
    out = read_known_findings(SHIPPED).apply(invs, faults)
    assert summary(invs)["verdict"] == "fail", out
    assert fo["details"]["measured_by_window"]["process_pause@replica-1#1"]["ejection_s"] == 59.5
    assert "known" not in fo and out["matched"] == []
    [beyond] = fo["beyond_known"]
    assert beyond["window"] == "process_pause@replica-1#1" and beyond["fault"] == "process_pause"
    assert beyond["bounds"] == {"max_ejection_s": 9.0}
    assert beyond["measured"] == {"max_ejection_s": 59.5} and beyond["beyond"] == ["max_ejection_s"]
    # fault_slo misses until the heal (but for the last 4 s's requests, whose
    # TTFT met its target): 55.5 s in, beyond its 12 s.
    slo = named(invs, "fault_slo")
    assert "known" not in slo
    assert slo["beyond_known"][0]["measured"] == {"max_last_missed_s": 55.5}
    assert [b["invariant"] for b in out["beyond"]] == ["failover", "fault_slo"]
    # The reports put the figure beside the bound, and call it new.
    s = summary(invs)
    s["findings"] = findings_of(s)
    [f] = [f for f in s["findings"] if f["invariant"] == "failover"]
    assert f["known"] is None
    assert f["beyond_known"] == [
        "process_pause@replica-1#1: max_ejection_s 59.5 > 9, beyond the known finding "
        + repr(beyond["reason"])]
    html = section_findings(s)
    assert "new</span>" in html and "beyond a known finding: process_pause@replica-1#1: " \
        "max_ejection_s 59.5 &gt; 9" in html
    assert "max_ejection_s 59.5 &gt; 9" in section_invariants(s, None)


@pytest.mark.parametrize("last_send, ejection, last_missed, failover_known", [
    (16.0, 6.0, 6.0, True),   # the measured ~6 s: still known
    (19.5, 9.5, 8.0, False),  # slower than the finding's 9 s: new
])
def test_an_ejection_within_the_shipped_bound_is_known_and_one_beyond_it_is_new(
        last_send, ejection, last_missed, failover_known):
    invs, faults = pause(last_send)
    out = read_known_findings(SHIPPED).apply(invs, faults)
    fo, slo = named(invs, "failover"), named(invs, "fault_slo")
    assert fo["valid"] is False and slo["valid"] is False  # both failed: late sends, misses
    # fault_slo's last miss: the last request sent to the paused replica
    # that waited more than the 4 s TTFT target: within its 12 s either way.
    assert slo["known"][0]["measured"] == {"max_last_missed_s": last_missed}
    assert slo["known"][0]["bounds"] == {"max_last_missed_s": 12.0}
    if failover_known:
        [k] = fo["known"]
        assert k["bounds"] == {"max_ejection_s": 9.0} and k["measured"] == {"max_ejection_s": 6.0}
        assert summary(invs)["verdict"] == "pass", out
        matched = {m["invariant"]: m for m in out["matched"]}
        assert matched["failover"]["measured"] == {"max_ejection_s": 6.0}
        assert matched["failover"]["violations"] == 2
        s = summary(invs)
        s["findings"] = findings_of(s)
        [f] = [f for f in s["findings"] if f["invariant"] == "failover"]
        assert f["known_bounds"] == ["max_ejection_s 6 <= 9"] and f["beyond_known"] == []
        assert "within its bounds: max_ejection_s 6 &lt;= 9" in section_findings(s)
    else:
        assert "known" not in fo and fo["beyond_known"][0]["measured"] == {
            "max_ejection_s": ejection}
        assert summary(invs)["verdict"] == "fail"


def finding(tmp_path, invariant, fault, target, **bounds):
    """A one-finding file with these bounds, read as a run reads it."""
    lines = [f"{k} = {v}" for k, v in bounds.items()]
    text = "\n".join(["[[finding]]", f'invariant = "{invariant}"', f'fault = "{fault}"',
                      f'target = "{target}"', *lines, 'reason = "r"', 'tracked = "T"', ""])
    return read_known_findings(write(tmp_path, text))


def covered(known, invs, faults=()):
    """(known?, what was beyond) after applying ``known`` to copies."""
    invs = json.loads(json.dumps(invs))
    known.apply(invs, list(faults))
    [inv] = [i for i in invs if i.get("valid") is False]
    return bool(inv.get("known")), [b["beyond"] for b in inv.get("beyond_known", [])]


def test_failover_late_sends_bound_and_a_replica_never_taken_back(tmp_path):
    invs, faults = pause(16.0)
    invs = [named(invs, "failover")]
    assert invs[0]["details"]["sent_after_bound"] == 2
    f = partial(finding, tmp_path, "failover", "process_pause", "replica-*")
    assert covered(f(max_ejection_s=9, max_late_sends=2), invs) == (True, [])
    assert covered(f(max_ejection_s=9, max_late_sends=1), invs) == (False, [["max_late_sends"]])
    assert covered(f(max_ejection_s=5.9), invs) == (False, [["max_ejection_s"]])
    # A replica not taken back after the heal: no failover finding covers it.
    never, _ = pause(16.0, readmit=False)
    never = [named(never, "failover")]
    assert never[0]["details"]["not_readmitted"] == 1
    assert covered(f(max_ejection_s=9, max_late_sends=99), never) == (False, [["not_readmitted"]])
    # Figures missing (a summary.json of a checker before measured_by_window):
    # beyond every bound, never within.
    bare = json.loads(json.dumps(invs))
    del bare[0]["details"]["measured_by_window"]
    known = f(max_ejection_s=9)
    assert covered(known, bare) == (False, [["max_ejection_s"]])
    known.apply(bare, [])
    assert bounds_text(bare[0]["beyond_known"][0]) == \
        "max_ejection_s not measured, bound 9.0 (beyond)"


def test_fault_slo_bounds_last_miss_and_goodput_floor(tmp_path):
    invs, _ = pause(16.0)
    invs = [named(invs, "fault_slo")]
    [row] = invs[0]["details"]["measured_by_window"].values()
    assert row["last_missed_s"] == 6.0 and row["goodput"] < 0.9 and row["missed"] == 3
    f = partial(finding, tmp_path, "fault_slo", "process_pause", "replica-*")
    assert covered(f(max_last_missed_s=6.0), invs) == (True, [])
    assert covered(f(max_last_missed_s=5.9), invs) == (False, [["max_last_missed_s"]])
    assert covered(f(min_window_goodput=0.8), invs) == (True, [])
    assert covered(f(min_window_goodput=0.85, max_last_missed_s=12), invs) == (
        False, [["min_window_goodput"]])
    # The misses' "sent Xs into" is the invoke's time, as last_missed_s (it
    # was the answer's, after the heal: 12.1 s into a pause the router
    # stopped using at 6 s).
    assert invs[0]["counterexamples"][0]["problem"].startswith("sent 5.0s into process_pause")


def test_duplicates_bound_per_window(tmp_path):
    p = Planted()
    p.fault(10, 40, kind="connection_reset", target="router-replica-0")
    p.served(5, "replica-0", "a", "b", "c", "d")
    p.served(12, "replica-1", "a", "b", "c")  # three re-sent inside the window
    [inv], faults = p.judge(NoDuplicateExecution())
    assert inv["details"]["violations_by_window"] == {"connection_reset@router-replica-0#1": 3}
    f = partial(finding, tmp_path, "no_duplicate_execution", "connection_reset",
                "router-replica-*")
    assert covered(f(max_duplicates=3), [inv], faults) == (True, [])
    assert covered(f(max_duplicates=2), [inv], faults) == (False, [["max_duplicates"]])
    # The shipped file's 10 covers it; a router re-sending everything does not.
    assert covered(read_known_findings(SHIPPED), [inv], faults) == (True, [])
    many = Planted()
    many.fault(10, 40, kind="connection_reset", target="router-replica-0")
    rids = [f"r{i}" for i in range(11)]
    many.served(5, "replica-0", *rids)
    many.served(12, "replica-1", *rids)
    [inv], faults = many.judge(NoDuplicateExecution())
    assert covered(read_known_findings(SHIPPED), [inv], faults) == (False, [["max_duplicates"]])


def test_orphans_bound_by_count_and_age(tmp_path):
    def kill(*ages):
        p = Planted()
        p.fault(10, 21, kind="process_kill", heal={
            "scope": "api_server", "orphan_bound_s": 10,
            "orphans": [{"pid": 100 + i, "names": "VLLM::EngineCore", **(
                {"alive_after_kill_s": a} if a is not None else {})}
                for i, a in enumerate(ages)]})
        [inv], faults = p.judge(NoOrphans())
        return [inv], faults
    invs, faults = kill(10.1, 10.1, 10.4)
    assert invs[0]["details"]["measured_by_window"] == {"process_kill@replica-1#1": {
        "orphans": 3, "scope": "api_server", "oldest_orphan_s": 10.4}}
    f = partial(finding, tmp_path, "no_orphans", "process_kill", "replica-*")
    assert covered(f(max_orphans=3), invs, faults) == (True, [])
    assert covered(f(max_orphans=2), invs, faults) == (False, [["max_orphans"]])
    assert covered(f(max_orphan_s=10.5), invs, faults) == (True, [])
    assert covered(f(max_orphan_s=10, max_orphans=3), invs, faults) == (False, [["max_orphan_s"]])
    assert covered(read_known_findings(SHIPPED), invs, faults) == (True, [])
    four, faults = kill(10.1, 10.1, 10.4, 10.2)  # a fourth survivor: new
    assert covered(read_known_findings(SHIPPED), four, faults) == (False, [["max_orphans"]])
    unaged, faults = kill(10.1, None)  # an age not recorded: beyond an age bound
    assert covered(f(max_orphan_s=60), unaged, faults) == (False, [["max_orphan_s"]])


def test_any_other_invariant_is_bounded_by_its_violations_per_window(tmp_path):
    inv = {"name": "stream_continuity", "valid": False, "details": {},
           "counterexamples": [{"problem": "cut", "window": "process_kill@replica-1#1"}] * 2}
    f = partial(finding, tmp_path, "stream_continuity", "process_kill", "replica-*")
    assert covered(f(max_violations=2), [inv]) == (True, [])
    assert covered(f(max_violations=1), [inv]) == (False, [["max_violations"]])


@pytest.mark.parametrize("bounds, error", [
    ("", r"finding 1: max_ejection_s is required: a known finding is an exception with a "
         r"size .*; failover takes max_ejection_s, max_late_sends"),
    ("max_late_sends = 3", "max_ejection_s is required"),
    ("max_ejection_s = 9.0\nmax_orphans = 3", "max_orphans does not bound failover; failover "
                                              "takes max_ejection_s, max_late_sends"),
    ("max_ejection = 9.0", r"unknown key\(s\) \['max_ejection'\].*failover: max_ejection_s"),
    ("max_ejection_s = -1", "max_ejection_s = -1 must be a finite number >= 0"),
    ("max_ejection_s = nan", "max_ejection_s = nan must be a finite number"),
    ("max_ejection_s = inf", "max_ejection_s = inf must be a finite number"),
    ('max_ejection_s = "9 s"', "max_ejection_s = '9 s' must be a finite number"),
    ("max_ejection_s = true", "max_ejection_s = True must be a finite number"),
])
def test_a_failover_finding_without_a_good_size_is_refused(tmp_path, bounds, error):
    text = FINDING.replace("max_ejection_s = 9.0\n", bounds + "\n" if bounds else "")
    with pytest.raises(ConfigError, match=error):
        read_known_findings(write(tmp_path, text))


@pytest.mark.parametrize("invariant, bounds, error", [
    ("fault_slo", "", "at least one bound is required.*fault_slo takes max_last_missed_s, "
                      "min_window_goodput"),
    ("fault_slo", "min_window_goodput = 1.5", "min_window_goodput = 1.5 must be a share "
                                              "from 0 to 1"),
    ("fault_slo", "max_ejection_s = 9.0", "max_ejection_s does not bound fault_slo"),
    ("no_orphans", "", "at least one bound.*no_orphans takes max_orphans, max_orphan_s"),
    ("no_duplicate_execution", "max_violations = 3",
     "max_violations does not bound no_duplicate_execution; no_duplicate_execution takes "
     "max_duplicates"),
    ("goodput", "", "at least one bound.*goodput takes max_violations"),
    ("goodput", "max_duplicates = 1", "max_duplicates does not bound goodput"),
])
def test_every_finding_needs_its_invariant_s_own_bounds(tmp_path, invariant, bounds, error):
    text = FINDING.replace('invariant = "failover"', f'invariant = "{invariant}"').replace(
        "max_ejection_s = 9.0\n", bounds + "\n" if bounds else "")
    with pytest.raises(ConfigError, match=error):
        read_known_findings(write(tmp_path, text))


def test_every_shipped_finding_has_a_size():
    for f in read_known_findings(SHIPPED).findings:
        assert f.bounds, f


def test_a_window_no_longer_shown_is_still_held_against_the_bounds():
    """A long run shows only the latest windows (failover MAX_WINDOW_ROWS):
    every window with violations keeps its figures (measured_by_window), so
    the first window, where the router never ejected, is still a new finding."""
    p = Planted()
    n = MAX_WINDOW_ROWS + 8
    p.steady(0, n * 30)
    for i in range(n):
        start = i * 30
        p.fault(start, start + 20)
        last = start + (19.5 if i == 0 else 6.0)  # the first: sent there until the heal
        t = start + 5.5
        while t <= last:
            p.request(t, start + 20.1, "replica-1")
            t += 0.5
        p.request(start + 21, start + 21.1, "replica-1")
    invs, faults = p.judge(Failover())
    rest = json.loads(json.dumps(invs))
    [fo] = invs
    d = fo["details"]
    assert "process_pause@replica-1#1" not in d["windows_shown"]
    assert len(d["measured_by_window"]) == n == len(d["violations_by_window"])
    assert d["measured_by_window"]["process_pause@replica-1#1"]["ejection_s"] == 19.5
    read_known_findings(SHIPPED).apply(invs, faults)
    assert "known" not in fo and summary(invs)["verdict"] == "fail"
    assert [b["window"] for b in fo["beyond_known"]] == ["process_pause@replica-1#1"]
    # Without that window, every one is within the bound: known.
    d = rest[0]["details"]
    del d["measured_by_window"]["process_pause@replica-1#1"]
    d["violations"] -= d["violations_by_window"].pop("process_pause@replica-1#1")
    read_known_findings(SHIPPED).apply(rest, faults)
    assert rest[0]["known"][0]["measured"] == {"max_ejection_s": 6.0}
