import json
import os

from reports.run_dir import RunDir
from reports.summary import build_summary, verdict_of


def test_run_dir_layout_and_latest_link(tmp_path):
    a = RunDir.create(tmp_path, "test_smoke[x/y]")
    b = RunDir.create(tmp_path, "test_smoke")
    assert a.path.is_dir() and a.logs.is_dir() and "/" not in a.run_id
    assert os.readlink(tmp_path / "latest") == b.run_id
    b.write_summary({"verdict": "pass"})
    assert json.loads((tmp_path / "latest" / "summary.json").read_text()) == {"verdict": "pass"}
    assert not list(b.path.glob(".*tmp"))  # atomic write leaves no temp file


def test_verdict_ranks_fail_over_unknown_over_pass():
    assert verdict_of([True, True]) == "pass"
    assert verdict_of([True, "unknown"]) == "unknown"
    assert verdict_of([True, False, "unknown"]) == "fail"
    assert verdict_of([]) == "unknown"


def test_summary_has_the_stable_keys_and_errors_make_a_pass_unknown():
    kw = dict(run_id="r", suite="s", started="t0", ended="t1",
              cluster={"backend": "local", "engine": "vllm", "nodes": []},
              counts={"invoke": 3, "ok": 2, "fail": 0, "info": 1},
              nemesis_counts={"info": 4}, faults=[],
              invariants=[{"name": "no_silent_loss", "valid": True, "details": {}}],
              workload={})
    s = build_summary(**kw)
    assert {"run_id", "suite", "started", "ended", "cluster", "ops", "faults", "invariants",
            "verdict"} <= set(s)
    assert s["ops"] == {"invoked": 3, "ok": 2, "fail": 0, "info": 1, "nemesis": 4}
    assert s["verdict"] == "pass"
    assert build_summary(**kw, errors=["nemesis crashed"])["verdict"] == "unknown"
