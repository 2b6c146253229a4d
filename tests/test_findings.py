"""Findings at the top of summary.json and report.html: one per failed
invariant, what went wrong in a sentence, its figures, example ops, whether
it is known, and the command that replays the test."""

from runs.replay import replay_line
from reports.findings import findings_of
from reports.html import section_findings


def summary():
    return {"replay": "python -m pytest suites/test_nemesis.py::t --seed 3", "invariants": [
        {"name": "goodput", "valid": True, "details": {"min_goodput": 0.95}},
        {"name": "failover", "valid": False,
         "details": {"windows": 2, "max_ejection_s": 6.2, "windows_shown": {}},
         "counterexamples": [{"problem": "sent to replica-1 6.0s after process_pause began "
                                         "(bound 5s)", "index": 296, "wall": "w",
                              "window": "process_pause@replica-1#1"}] * 4,
         "known": [{"reason": "vllm-router ejects slowly", "tracked": "T-1"}]},
        {"name": "no_silent_loss", "valid": False, "details": {"never_completed": 2},
         "counterexamples": []},
        {"name": "recovery", "valid": "unknown", "details": {}}]}


def test_each_failed_invariant_is_a_finding_with_what_figures_examples_and_replay():
    fs = findings_of(summary())
    assert [f["invariant"] for f in fs] == ["failover", "no_silent_loss"]
    failover, lost = fs
    assert failover["what"].startswith("the router kept sending new requests to a replica")
    assert failover["what"].endswith(": sent to replica-1 6.0s after process_pause began "
                                     "(bound 5s)")
    assert failover["known"] == ["vllm-router ejects slowly"]
    assert failover["figures"] == {"windows": 2, "max_ejection_s": 6.2}
    assert len(failover["examples"]) == 3 and failover["examples"][0]["index"] == 296
    assert failover["replay"] == "python -m pytest suites/test_nemesis.py::t --seed 3"
    assert lost["known"] is None and lost["what"] == "requests were sent and never completed"
    assert findings_of({"invariants": [{"name": "goodput", "valid": True}]}) == []


def test_the_report_opens_with_them():
    s = summary()
    s["findings"] = findings_of(s)
    html = section_findings(s)
    assert html.startswith('<h2 id="findings">Findings</h2>')
    assert "known</span> (vllm-router ejects slowly)" in html and "new</span>" in html
    assert 'href="#op-296"' in html and "replay: python -m pytest" in html
    assert section_findings({"findings": []}) == ""


def test_the_replay_keeps_the_options_and_drops_the_selection_and_secrets():
    line = replay_line("suites/test_smoke.py::test_kill", [
        "suites/", "-m", "smoke", "--model", "/m", "-ktest_x", "--engine-env", "HF_TOKEN=abc",
        "--engine-env=OMP_NUM_THREADS=1", "--api-key=s3cret", "tests/test_x.py::t"])
    assert line == ("python -m pytest suites/test_smoke.py::test_kill --model /m --engine-env "
                    "'HF_TOKEN=<redacted>' --engine-env=OMP_NUM_THREADS=1 "
                    "'--api-key=<redacted>'")
    assert "abc" not in line and "s3cret" not in line
