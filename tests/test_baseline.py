"""Qualification against a baseline run (reports/baseline.py and
``python -m reports compare-baseline``). The template summary is a real
run's (reports/runs/...-test_latency_is_seen_while_injected_and_gone_after_heal,
14 invariants, steady + one fault + one after-heal window), trimmed of the
cluster description and rebuilt here: run directories are not in git."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from ordeal.config import ConfigError
from reports.__main__ import main
from reports.baseline import BaselineError, apply_baseline, compare, extract_figures, load_baseline
from reports.thresholds import InvariantRules, Thresholds, load_thresholds

FAULT = "network_latency@client-router#1"
PCTS = ("count", "mean", "min", "max", "p50", "p90", "p95", "p99", "p99.9")


#: The recorded runs had 33 to 106 requests per window; their counts are
#: scaled so that every percentile rests on enough samples to be compared
#: (the default min_tail_samples); ``test_a_percentile_of_few_samples_is_not_compared``
#: covers the recorded counts.
COUNT_SCALE = 20


def _hist(count, *values):
    return dict(zip(PCTS, (count * COUNT_SCALE, *values), strict=True))


def _window(phase, requests, ttft, tpot, itl, e2e):
    return {"phase": phase, "requests": requests, "ok": requests, "fail": 0, "info": 0,
            "goodput": 1.0, "error_rate": 0.0, "ttft_ms": _hist(*ttft),
            "tpot_ms": _hist(*tpot), "itl_ms": _hist(*itl), "e2e_ms": _hist(*e2e)}


def real_summary() -> dict:
    """The real run's summary.json (figures as recorded)."""
    windows = {
        "steady": _window(
            "steady", 33,
            (33, 177.028, 12.871, 911.484, 82.277, 407.545, 713.49, 757.612, 757.612),
            (33, 2.137, 0.001, 15.859, 0.016, 4.015, 6.89, 8.248, 8.248),
            (472, 2.957, 0.0, 142.535, 0.0, 4.263, 5.871, 56.266, 135.655),
            (33, 220.15, 34.055, 911.505, 120.315, 407.545, 757.612, 871.465, 871.465)),
        FAULT: _window(
            "fault", 68,
            (68, 469.814, 47.391, 836.762, 468.79, 550.133, 572.585, 757.612, 757.612),
            (68, 3.155, 0.001, 24.797, 1.507, 7.316, 9.68, 24.29, 24.29),
            (1082, 3.029, 0.0, 223.398, 0.0, 5.207, 8.248, 63.44, 102.525),
            (68, 518.172, 157.386, 1035.136, 497.779, 620.276, 685.513, 982.578, 982.578)),
        f"after_heal:{FAULT}": _window(
            "after_heal", 106,
            (106, 70.147, 11.128, 594.566, 27.387, 125.225, 183.117, 468.79, 478.261),
            (106, 4.421, 0.001, 32.707, 3.421, 8.935, 19.107, 22.875, 30.879),
            (1791, 4.981, 0.0, 477.186, 2.691, 5.755, 7.925, 57.402, 432.747),
            (106, 154.8, 38.81, 597.805, 104.596, 340.408, 478.261, 572.585, 595.954)),
    }

    def inv(name, details, valid=True):
        return {"name": name, "valid": valid, "details": details, "counterexamples": []}

    def sub(keys):
        return {k: {kk: w[kk] for kk in ("phase", "requests", *keys)}
                for k, w in windows.items()}

    return {
        "schema": 1,
        "run_id": "20261201T033609Z-test_latency_is_seen_while_injected_and_gone_after_heal-9438",
        "suite": "test_latency_is_seen_while_injected_and_gone_after_heal",
        "started": "2026-12-01T03:36:09.086Z", "ended": "2026-12-01T03:36:46.530Z",
        "cluster": {"backend": "local", "engine": "vllm", "nodes": []},
        "workload": {"model": "ordeal-tiny", "duration_s": 24.0, "mode": "open", "rate": 6.0,
                     "concurrency": 4, "seed": 0, "max_tokens": [8, 32]},
        "ops": {"invoked": 207, "ok": 207, "fail": 0, "info": 0, "nemesis": 4},
        "faults": [{"kind": "network_latency", "target": "client-router",
                    "injected": "2026-12-01T03:36:15.105Z",
                    "healed": "2026-12-01T03:36:25.094Z", "error": None}],
        "schedule": [{"at_s": 6.0, "action": "inject", "kind": "network_latency",
                      "target": "client-router", "key": 0},
                     {"at_s": 16.0, "action": "heal", "kind": "network_latency",
                      "target": "client-router", "key": 0}],
        "invariants": [
            inv("no_silent_loss", {"invoked": 207, "completed": 207, "never_completed": 0}),
            inv("stream_wellformed", {"streams": 181, "ok_streams": 181}),
            inv("usage_matches_tokens", {"checked": 207, "exact": 181, "violations": 0}),
            inv("no_duplicate_execution", {"requests": 207, "duplicated": 0}),
            inv("canary_determinism", {"canaries": 21, "matched": 18, "differed": 0}),
            inv("slo_latency", {"targets": {"ttft_ms": 2000.0, "tpot_ms": 200.0,
                                            "e2e_ms": 10000.0},
                                "percentile": 99.0, "windows": windows, "breaches": {}}),
            inv("goodput", {"min_goodput": 0.95, "windows": sub(["goodput"])}),
            inv("error_rate", {"max_error_rate": 0.01,
                               "windows": sub(["fail", "info", "error_rate"])}),
            inv("availability", {"min_availability": 0.5,
                                 "windows": {FAULT: {"requests": 68, "ok": 68,
                                                     "availability": 1.0}},
                                 "fault_windows": 1, "below": []}),
            inv("recovery", {"recovery_bound_s": 30.0, "after_heal_s": 30.0,
                             "windows": {FAULT: {"recovered": True, "recovery_s": 0.0,
                                                 "requests_after_heal": 106}}}),
            inv("restart_readiness", {"restart_bound_s": 240.0, "restarts": [],
                                      "why": "no node was restarted in this run"}),
            inv("health_truthful", {"samples": 36, "stall_s": 10.0}),
            inv("counters_monotonic", {"samples": 36, "restarts_seen": 0}),
            inv("leak_bound", {"rss_factor": 1.5, "rss_slack_mb": 256.0, "nodes": {
                "replica-0": {"baseline_mb": 3025, "drained_mb": 3027, "limit_mb": 4794},
                "replica-1": {"baseline_mb": 3052, "drained_mb": 3055, "limit_mb": 4833}}}),
        ],
        "errors": [],
        "verdict": "pass",
    }


def _inv(summary, name):
    return next(i for i in summary["invariants"] if i["name"] == name)


def _latency_window(summary, window="steady"):
    return _inv(summary, "slo_latency")["details"]["windows"][window]


def _regressed(cmp):
    return {r["figure"] for r in cmp.to_dict()["regressions"]}


def _write_run(root: Path, name: str, summary: dict) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    return d


# ------------------------------------------------------------------ figures


#: The recorded summary's figures, counted by hand: 3 windows (steady, the
#: fault, its after-heal) x 4 latencies x 3 percentiles, goodput and error
#: rate per window, the fault's availability and recovery, two replicas' leak.
REAL_FIGURES = 3 * 4 * 3 + 3 * 2 + 1 + 1 + 2


def test_figures_of_a_real_summary_cover_every_slo_figure():
    figs = extract_figures(real_summary())
    names = set(figs)
    for win in ("steady", f"fault:{FAULT}", f"after_heal:{FAULT}"):
        for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            for p in ("p50", "p90", "p99"):
                assert f"slo_latency.{win}.{m}.{p}" in names
        assert f"goodput.{win}" in names and f"error_rate.{win}" in names
    assert {f"availability.fault:{FAULT}", f"recovery.after_heal:{FAULT}.recovery_s",
            "leak_bound.replica-0.drained_mb", "leak_bound.replica-1.drained_mb"} <= names
    assert len(names) == REAL_FIGURES
    assert figs["slo_latency.steady.ttft_ms.p99"].value == 757.612
    assert figs["slo_latency.steady.ttft_ms.p99"].better == "lower"
    assert figs["goodput.steady"].better == "higher"
    assert figs[f"availability.fault:{FAULT}"].better == "higher"
    assert figs["error_rate.steady"].better == "lower"


def test_restart_readiness_seconds_are_figures():
    s = real_summary()
    _inv(s, "restart_readiness")["details"]["restarts"] = [
        {"target": "replica-1", "ready_after_s": 48.69, "index": 1096}]
    figs = extract_figures(s)
    assert figs["restart_readiness.replica-1#1.ready_after_s"].value == 48.69
    slow = copy.deepcopy(s)
    _inv(slow, "restart_readiness")["details"]["restarts"][0]["ready_after_s"] = 80.0
    assert _regressed(compare(slow, s)) == {"restart_readiness.replica-1#1.ready_after_s"}
    a_bit = copy.deepcopy(s)
    _inv(a_bit, "restart_readiness")["details"]["restarts"][0]["ready_after_s"] = 55.0
    assert compare(a_bit, s).verdict == "pass"  # +6 s: under the 10 s floor


# --------------------------------------------------------------- comparison


def test_an_identical_run_passes():
    base = real_summary()
    cmp = compare(copy.deepcopy(base), base)
    d = cmp.to_dict()
    assert d["verdict"] == "pass" and d["regressions"] == [] and d["improvements"] == []
    assert d["not_compared"] == [] and d["warnings"] == []
    # counted by hand from the recorded summary, not by the code under test
    assert sum(1 for i in base["invariants"] if i["valid"] in (True, False)) == 14
    assert d["compared"] == {"invariants": 14, "figures": REAL_FIGURES}
    assert d["unchanged"] == 14 + REAL_FIGURES


def test_planted_latency_regression_is_flagged_per_figure():
    base = real_summary()
    cur = copy.deepcopy(base)
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        _latency_window(cur)[m]["p99"] *= 1.5
    cmp = compare(cur, base)
    # tpot p99 8.248 -> 12.372 is +50% but only +4.1 ms: under the 5 ms floor
    assert _regressed(cmp) == {"slo_latency.steady.ttft_ms.p99",
                               "slo_latency.steady.itl_ms.p99",
                               "slo_latency.steady.e2e_ms.p99"}
    assert cmp.verdict == "regressed"
    r = next(r for r in cmp.to_dict()["regressions"]
             if r["figure"] == "slo_latency.steady.ttft_ms.p99")
    assert r["baseline"] == 757.612 and r["current"] == pytest.approx(1136.418)
    assert r["change"] == pytest.approx(378.806) and r["relative_change"] == 0.5
    assert r["threshold"] == "worse by > 20% and > 5 ms"


def test_added_latency_everywhere_regresses_every_window():
    base = real_summary()
    cur = copy.deepcopy(base)
    for w in _inv(cur, "slo_latency")["details"]["windows"].values():
        for m in ("ttft_ms", "e2e_ms"):
            for p in ("p50", "p90", "p99"):
                w[m][p] += 400.0  # the planted regression: +400 ms on every request
    regressed = _regressed(compare(cur, base))
    assert len(regressed) == 3 * 2 * 3
    assert f"slo_latency.after_heal:{FAULT}.e2e_ms.p50" in regressed


def test_invariant_going_false_and_error_rate_up_are_flagged():
    base = real_summary()
    cur = copy.deepcopy(base)
    _inv(cur, "usage_matches_tokens")["valid"] = False
    er = _inv(cur, "error_rate")
    er["valid"] = False
    er["details"]["windows"]["steady"].update(fail=2, error_rate=0.0606)
    _inv(cur, "goodput")["details"]["windows"]["steady"]["goodput"] = 0.9394
    cmp = compare(cur, base)
    assert _regressed(cmp) == {"invariant:usage_matches_tokens", "invariant:error_rate",
                               "error_rate.steady", "goodput.steady"}
    rows = {r["figure"]: r for r in cmp.to_dict()["regressions"]}
    assert rows["invariant:usage_matches_tokens"]["change"] == "true -> false"
    assert rows["error_rate.steady"]["change"] == pytest.approx(0.0606)
    assert rows["error_rate.steady"]["threshold"] == "worse by > 1 pp"


def test_noise_under_the_thresholds_passes():
    base = real_summary()
    cur = copy.deepcopy(base)
    for w in _inv(cur, "slo_latency")["details"]["windows"].values():
        for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            for p in ("p50", "p90", "p99"):
                w[m][p] *= 1.18  # +18%: under the 20% relative threshold
        w["tpot_ms"]["p50"] += 3.0  # many times a ~0 ms figure, but under the 5 ms floor
    _inv(cur, "error_rate")["details"]["windows"]["steady"]["error_rate"] = 0.005
    _inv(cur, "goodput")["details"]["windows"]["steady"]["goodput"] = 0.995
    _inv(cur, "leak_bound")["details"]["nodes"]["replica-0"]["drained_mb"] = 3200
    cmp = compare(cur, base)
    assert cmp.verdict == "pass", cmp.to_dict()["regressions"]
    # tiny latencies (p50 ~0 ms) grew several-fold but by less than the 5 ms floor
    assert _latency_window(cur)["tpot_ms"]["p50"] > 100 * _latency_window(base)["tpot_ms"]["p50"]


def test_improvements_are_counted_not_failed():
    base = real_summary()
    cur = copy.deepcopy(base)
    _latency_window(cur)["ttft_ms"]["p99"] = 300.0
    _inv(base, "canary_determinism")["valid"] = False
    d = compare(cur, base).to_dict()
    assert d["verdict"] == "pass"
    assert {r["figure"] for r in d["improvements"]} == {"slo_latency.steady.ttft_ms.p99",
                                                        "invariant:canary_determinism"}
    assert d["improved"] == 2


def test_unknown_and_missing_invariants_regress_unless_turned_off():
    base = real_summary()
    cur = copy.deepcopy(base)
    _inv(cur, "recovery")["valid"] = "unknown"
    cur["invariants"] = [i for i in cur["invariants"] if i["name"] != "leak_bound"]
    cmp = compare(cur, base)
    assert _regressed(cmp) == {"invariant:recovery", "invariant:leak_bound"}
    nc = {n["figure"]: n["why"] for n in cmp.to_dict()["not_compared"]}
    assert nc["leak_bound.replica-0.drained_mb"].startswith("only in the baseline")
    lenient = Thresholds(invariants=InvariantRules(unknown_is_regression=False,
                                                   missing_is_regression=False))
    d = compare(cur, base, lenient).to_dict()
    assert d["verdict"] == "pass"
    assert {r["figure"] for r in d["reported"]} == {"invariant:recovery",
                                                    "invariant:leak_bound"}
    # false is a regression whatever the rules for unknown and missing say
    _inv(cur, "stream_wellformed")["valid"] = False
    assert _regressed(compare(cur, base, lenient)) == {"invariant:stream_wellformed"}
    # an invariant that did not hold in the baseline never regresses
    _inv(base, "recovery")["valid"] = False
    assert "invariant:recovery" not in _regressed(compare(cur, base))


def test_figures_in_one_run_only_are_listed_not_dropped():
    base = real_summary()
    cur = copy.deepcopy(base)
    del _inv(cur, "slo_latency")["details"]["windows"][f"after_heal:{FAULT}"]
    cur["invariants"].append({"name": "new_check", "valid": True, "details": {}})
    _inv(cur, "goodput")["details"]["windows"]["steady"]["goodput"] = None
    d = compare(cur, base).to_dict()
    nc = {n["figure"]: n["why"] for n in d["not_compared"]}
    assert len([n for n in nc if n.startswith(f"slo_latency.after_heal:{FAULT}")]) == 12
    assert nc["invariant:new_check"] == "not in the baseline (a new check)"
    assert nc["goodput.steady"] == "no value in this run"
    assert d["verdict"] == "pass"


def test_different_workloads_are_warned():
    base = real_summary()
    cur = copy.deepcopy(base)
    cur["workload"]["rate"] = 12.0
    cur["schedule"][0]["at_s"] = 7.0
    w = compare(cur, base).warnings
    assert any("rate=12.0 (baseline 6.0)" in x for x in w)
    assert any("fault schedules" in x for x in w)


def test_a_percentile_of_few_samples_is_not_compared(tmp_path):
    """With the recorded counts (33 requests in the steady window) a p99 is
    the slowest request or so: a 3x slower one is not a regression of the
    build, so p99 is listed as not compared, with the counts; p50 still is."""
    base = real_summary()
    for h in _latency_window(base).values():
        if isinstance(h, dict):
            h["count"] //= COUNT_SCALE
    cur = copy.deepcopy(base)
    steady = _latency_window(cur)
    steady["ttft_ms"]["p99"] *= 3
    cmp = compare(cur, base)
    nc = {n.name: n.why for n in cmp.not_compared}
    why = nc["slo_latency.steady.ttft_ms.p99"]
    assert "33 samples in the baseline, 33 in this run" in why and "needs 500" in why, why
    assert "slo_latency.steady.ttft_ms.p90" in nc  # needs 50
    assert cmp.verdict == "pass", cmp.to_dict()["regressions"]

    steady["ttft_ms"]["p50"] += 400.0  # p50 needs 10 samples: compared
    assert _regressed(compare(cur, base)) == {"slo_latency.steady.ttft_ms.p50"}

    f = tmp_path / "all.toml"  # 0 compares every figure, max included
    f.write_text('[latency]\nmin_tail_samples = 0\npercentiles = ["p99", "max"]\n')
    steady["ttft_ms"]["max"] *= 3
    assert _regressed(compare(cur, base, load_thresholds(f))) == {
        "slo_latency.steady.ttft_ms.p99", "slo_latency.steady.ttft_ms.max"}
    f.write_text('[latency]\nmin_tail_samples = 1\npercentiles = ["max"]\n')
    why = {n.name: n.why for n in compare(cur, base, load_thresholds(f)).not_compared}
    assert "single sample" in why["slo_latency.steady.ttft_ms.max"]


def test_ignore_patterns_and_a_thresholds_file_change_the_outcome(tmp_path):
    base = real_summary()
    cur = copy.deepcopy(base)
    _latency_window(cur)["e2e_ms"]["p99"] *= 1.5
    _inv(cur, "health_truthful")["valid"] = False
    assert _regressed(compare(cur, base)) == {"slo_latency.steady.e2e_ms.p99",
                                              "invariant:health_truthful"}
    f = tmp_path / "t.toml"
    f.write_text('ignore = ["health_truthful"]\n'
                 '[latency]\nrelative = 0.6\nabsolute_ms = 1\npercentiles = ["p50", "p99"]\n'
                 '[rates]\nerror_rate = 0.05\n[invariants]\nunknown_is_regression = false\n')
    t = load_thresholds(f)
    assert t.latency.relative == 0.6 and t.latency.percentiles == ("p50", "p99")
    assert t.rates.error_rate == 0.05 and t.rates.goodput == 0.01
    assert t.invariants.unknown_is_regression is False
    cmp = compare(cur, base, t)
    assert cmp.verdict == "pass"
    assert "slo_latency.steady.e2e_ms.p90" not in extract_figures(base, t)
    assert {"figure": "invariant:health_truthful",
            "why": "ignored by the thresholds file"} in cmp.to_dict()["not_compared"]
    assert load_thresholds(None) == Thresholds()


@pytest.mark.parametrize("text, expect", [
    ("[latncy]\nrelative = 0.1\n", "unknown key(s) ['latncy']"),
    ("[latency]\nrel = 0.1\n", "[latency]: unknown key(s) ['rel']"),
    ("[latency]\nrelative = \"20%\"\n", "[latency] relative: must be a number >= 0"),
    ("[seconds]\nabsolute_s = -1\n", "[seconds] absolute_s: must be a number >= 0"),
    ("[rates]\nerror_rate = true\n", "[rates] error_rate: must be a number >= 0"),
    ("[latency]\npercentiles = [\"p42\"]\n", "unknown value(s) ['p42']"),
    ("[latency]\nphases = \"steady\"\n", "phases: must be a list of strings"),
    ("[invariants]\nunknown_is_regression = 1\n", "must be true or false"),
    ("latency = 3\n", "latency must be a table"),
    ("[latency\n", "cannot read it as TOML"),
])
def test_a_bad_thresholds_file_is_a_clear_error(tmp_path, text, expect):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_thresholds(f)
    assert expect in str(e.value) and f"--thresholds {f}" in str(e.value)


def test_a_missing_thresholds_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_thresholds(tmp_path / "nope.toml")


# ----------------------------------------------------------------- baseline


def test_load_baseline_reads_a_run_dir_or_says_what_is_wrong(tmp_path):
    good = _write_run(tmp_path, "good", real_summary())
    assert load_baseline(good)["run_id"] == real_summary()["run_id"]
    assert load_baseline(good / "summary.json")["suite"] == real_summary()["suite"]
    with pytest.raises(BaselineError, match="no such directory.*reports/runs/<run id>"):
        load_baseline(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BaselineError, match=r"empty/summary.json is missing"):
        load_baseline(tmp_path / "empty")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "summary.json").write_text('{"schema": 1, "invar')
    with pytest.raises(BaselineError, match="unreadable"):
        load_baseline(damaged)
    old = real_summary()
    old["schema"] = 0
    with pytest.raises(BaselineError, match="schema 0, this Ordeal reads schema 1"):
        load_baseline(_write_run(tmp_path, "old", old))
    bare = real_summary()
    bare["invariants"] = []
    with pytest.raises(BaselineError, match="no invariants to compare"):
        load_baseline(_write_run(tmp_path, "bare", bare))
    with pytest.raises(BaselineError, match="not a summary"):
        load_baseline(_write_run(tmp_path, "list", [1, 2]))  # type: ignore[arg-type]


def test_apply_baseline_adds_qualification_and_keeps_the_verdict(tmp_path):
    base_dir = _write_run(tmp_path, "base", real_summary())
    same = apply_baseline(real_summary(), base_dir)
    assert same["qualification"] == "pass" and same["baseline"]["verdict"] == "pass"
    assert same["baseline"]["dir"] == str(base_dir)
    cur = real_summary()
    _latency_window(cur)["ttft_ms"]["p99"] *= 1.5
    out = apply_baseline(cur, base_dir)
    assert out is cur and cur["verdict"] == "pass"  # the invariants still hold
    assert cur["qualification"] == "regressed"
    assert [r["figure"] for r in cur["baseline"]["regressions"]] == [
        "slo_latency.steady.ttft_ms.p99"]
    again = copy.deepcopy(cur)
    assert apply_baseline(again, base_dir) == cur  # idempotent
    json.dumps(cur)  # summary.json stays JSON


def test_apply_baseline_never_raises(tmp_path):
    s = apply_baseline(real_summary(), tmp_path / "gone")
    assert s["qualification"] == "unknown" and "no such directory" in s["baseline"]["error"]
    bad = tmp_path / "t.toml"
    bad.write_text("[nope]\n")
    base_dir = _write_run(tmp_path, "base", real_summary())
    s = apply_baseline(real_summary(), base_dir, bad)
    assert s["qualification"] == "unknown" and "unknown key(s) ['nope']" in s["baseline"]["error"]


# ---------------------------------------------------------------------- CLI


def _cli(*args):
    out = io.StringIO()
    return main(["compare-baseline", *map(str, args)], out=out), out.getvalue()


def test_cli_exit_status_and_table(tmp_path, capsys):
    base = _write_run(tmp_path, "base", real_summary())
    same = _write_run(tmp_path, "same", real_summary())
    slow = real_summary()
    _latency_window(slow)["e2e_ms"]["p99"] *= 1.5
    slow_dir = _write_run(tmp_path, "slow", slow)

    rc, text = _cli(same, base)
    assert rc == 0 and "qualification PASS" in text and "0 regressed" in text

    rc, text = _cli(slow_dir, base)
    assert rc == 1 and "qualification REGRESSED: 1 regressed" in text
    line = next(x for x in text.splitlines() if "slo_latency.steady.e2e_ms.p99" in x)
    assert line.startswith("REGRESSED") and "+50.0%" in line and "> 20% and > 5 ms" in line

    rc, text = _cli(slow_dir, base, "--json")
    assert rc == 1 and json.loads(text)["regressions"][0]["figure"] == (
        "slo_latency.steady.e2e_ms.p99")

    rc, text = _cli(same, base, "--all")
    assert rc == 0 and "UNCHANGED  invariant:no_silent_loss" in text

    rc, _ = _cli(same, tmp_path / "missing")
    assert rc == 2 and "no such directory" in capsys.readouterr().err
    (tmp_path / "norun").mkdir()
    rc, _ = _cli(same, tmp_path / "norun")
    assert rc == 2 and "summary.json is missing" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[latency]\nrelative = -0.2\n")
    rc, _ = _cli(same, base, "--thresholds", bad)
    assert rc == 2 and "must be a number >= 0" in capsys.readouterr().err
    lenient = tmp_path / "lenient.toml"
    lenient.write_text("[latency]\nrelative = 0.6\n")
    assert _cli(slow_dir, base, "--thresholds", lenient)[0] == 0


def test_cli_resolves_run_ids_under_runs_dir(tmp_path):
    runs = tmp_path / "runs"
    _write_run(runs, "20261201T000000Z-a-0001", real_summary())
    _write_run(runs, "20261201T000100Z-a-0002", real_summary())
    out = io.StringIO()
    rc = main(["--runs-dir", str(runs), "compare-baseline", "20261201T000100Z-a-0002",
               "20261201T000000Z-a-0001"], out=out)
    assert rc == 0 and "qualification PASS" in out.getvalue()


# ------------------------------------------------------- real run histories

REAL_RUNS = Path(__file__).resolve().parents[1] / "reports" / "runs"


def _real_summaries():
    out = []
    for d in sorted(REAL_RUNS.glob("2*"))[-40:] if REAL_RUNS.is_dir() else []:
        try:
            s = load_baseline(d)
        except BaselineError:
            continue
        if any(i["name"] == "slo_latency" for i in s["invariants"]):
            out.append(s)
    return out


EXAMPLE_RUN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gpu-triton-h200"


def test_real_runs_pass_against_themselves_and_flag_added_latency(tmp_path):
    """Over real runs: the recorded one of this file and the committed
    example run (docs/examples), read back from run dirs written here, so a
    fresh clone runs it; plus the runs in reports/runs (not in git) where
    there are some."""
    _write_run(tmp_path, "20261201T033609Z-recorded", real_summary())
    (tmp_path / "example").mkdir()
    (tmp_path / "example" / "summary.json").write_bytes(
        (EXAMPLE_RUN / "summary.json").read_bytes())
    summaries = [load_baseline(tmp_path / "20261201T033609Z-recorded"),
                 load_baseline(tmp_path / "example"), *_real_summaries()]
    assert all(any(i["name"] == "slo_latency" for i in s["invariants"]) for s in summaries[:2])
    flagged = 0
    for s in summaries:
        assert compare(copy.deepcopy(s), s).verdict == "pass", s["run_id"]
        slow = copy.deepcopy(s)
        steady = _latency_window(slow)
        if (steady.get("e2e_ms") or {}).get("count", 0) < 10:
            continue  # p50 rests on too few samples to be compared
        steady["e2e_ms"]["p50"] += max(400.0, steady["e2e_ms"]["p50"])
        assert "slo_latency.steady.e2e_ms.p50" in _regressed(compare(slow, s)), s["run_id"]
        flagged += 1
    assert flagged >= 2  # both committed runs have enough steady samples to be judged


def test_the_documented_thresholds_file_is_the_defaults(tmp_path):
    import reports.baseline as mod
    block = mod.__doc__.split("Thresholds file")[1].split("::\n", 1)[1]
    f = tmp_path / "doc.toml"
    f.write_text("\n".join(line[4:] for line in block.splitlines()))
    assert load_thresholds(f) == Thresholds()
