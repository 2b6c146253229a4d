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
from pathlib import Path

import pytest

from invariants import Failover, FaultSLO, RunContext
from invariants.known import (
    SHIPPED_DIR,
    KnownFinding,
    KnownFindings,
    embedded_file,
    read_known_findings,
)
from ordeal.config import ConfigError
from ordeal.history.ops import Op
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
reason = "the router keeps sending to a paused replica"
tracked = "TICKET-1"
'''


# -- the file ------------------------------------------------------------------------------------

def test_a_good_file_is_read_with_its_digest(tmp_path):
    known = read_known_findings(write(tmp_path, FINDING))
    assert known.findings == (KnownFinding("failover", "the router keeps sending to a paused "
                                           "replica", "TICKET-1", "process_pause", "replica-*"),)
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
    assert out["matched"] == [{**PAUSE.describe(), "violations": 2}]
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