"""Issue 43: every file or value a run names is checked when pytest is
configured, before collection and any cluster: a mistake ends pytest with
rc 4 (usage error) and one line that says what and how to fix it, never a
traceback after the session started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args, says", [
    (["--slo", "{bad_slo}"], "[slo]: unknown key(s) ['ttft_msx']"),
    (["--model", "/nonexistent/model"], "--model /nonexistent/model: no such directory"),
    (["--workload", "/nonexistent.toml"], "workload file /nonexistent.toml: no such file"),
    (["--known-findings", "/nonexistent.toml"], "known-findings file /nonexistent.toml: no such"),
    (["--require-judged", "failovr"], "--require-judged: unknown invariant(s) ['failovr']"),
    (["--duration", "30m1h"], "--duration: '30m1h': give each unit once"),
    (["--replica-gpus", "first"], "--replica-gpus 'first'"),
])
def test_a_bad_input_ends_pytest_at_once_with_a_usage_error(tmp_path, args, says):
    bad_slo = tmp_path / "slo.toml"
    bad_slo.write_text("[slo]\nttft_msx = 3\n")
    argv = [a.format(bad_slo=bad_slo) for a in args]
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_smoke.py", "-m", "smoke",
                           "-p", "no:cacheprovider", "-q", *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert lines == [lines[0]] and lines[0].startswith("ERROR: "), lines
    assert says in lines[0], lines[0]
