"""CI's time report (.ci/budget.py) and the cluster-start count it reads
(clusters/base.py note_start): every start, from any process, is one line,
and the report counts them by backend and by test file (issue 46)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from clusters.base import STARTS_ENV, note_start

REPO = Path(__file__).resolve().parent.parent


def budget_module():
    spec = importlib.util.spec_from_file_location("ci_budget", REPO / ".ci" / "budget.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_start_is_one_line_naming_the_test_that_made_it(tmp_path, monkeypatch):
    starts = tmp_path / "starts.tsv"
    monkeypatch.setenv(STARTS_ENV, str(starts))
    note_start("local", "vllm", 2, 41.23)
    # A start in a child process (a test that runs pytest or a script) counts too.
    subprocess.run([sys.executable, "-c", "from clusters.base import note_start; "
                    "note_start('docker', 'vllm', 1, 7)"], cwd=REPO, check=True,
                   env={**os.environ, "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"})
    rows = [r.split("\t") for r in starts.read_text().splitlines()]
    assert [r[:4] for r in rows] == [["local", "vllm", "2", "41.2"], ["docker", "vllm", "1", "7.0"]]
    assert rows[0][4] == ("tests/test_ci_budget.py::"
                          "test_each_start_is_one_line_naming_the_test_that_made_it"), rows
    assert rows[1][4] == "tests/x.py::t", rows
    monkeypatch.delenv(STARTS_ENV)
    note_start("local", "vllm", 2, 1.0)  # no variable: nothing written
    assert len(starts.read_text().splitlines()) == 2


def test_the_report_counts_starts_and_names_a_test_over_twice_its_figure(tmp_path):
    out = tmp_path / ".ci-out"
    out.mkdir()
    (out / "5.time").write_text("the suite's own tests\t2000\n")
    (out / "5.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_baseline_real" '
        'name="test_a" time="250.0"/><testcase classname="tests.test_fast" name="test_b" '
        'time="0.1"/></testsuite></testsuites>')
    (out / "cluster-starts.tsv").write_text(
        "local\tvllm\t2\t40.0\ttests/test_a.py::t1\t1\n"
        "local\tvllm\t2\t42.0\ttests/test_a.py::t2\t1\n"
        "docker\tvllm\t2\t60.0\ttests/test_d.py::t\t2\n")
    text = budget_module().report(out)
    assert "cluster starts: 3 (docker/vllm 1, local/vllm 2)" in text, text
    assert "2 start(s),     82s to ready: tests/test_a.py" in text, text
    # test_baseline_real.py has a figure of 100 s in tests/ci_budget.toml: 250 s is over 2x.
    assert "WARNING 250s > 2 x 100s: tests/test_baseline_real.py::test_a" in text, text
    assert "test_fast" not in text.split("over 2x")[1], text
