"""tests/conftest.py ``require_component`` and the ``needs`` marker (issue
28): a component that .ci/setup installs fails the test with the reason
under CI and skips elsewhere, asked when the test is set up."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import TESTS, require_component, under_ci


@pytest.mark.parametrize("value, ci", [("true", True), ("1", True), ("yes", True),
                                       ("", False), ("0", False), ("false", False),
                                       ("No", False), (None, False)])
def test_under_ci_reads_the_ci_variable(monkeypatch, value, ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert under_ci() is ci


def test_a_missing_component_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception,
                       match=r"Docker engine is missing under CI: no Docker engine answers "
                             r"\(\.ci/setup installs it\)"):
        require_component("Docker engine", "no Docker engine answers")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception,
                       match="Docker engine is missing: no Docker engine answers"):
        require_component("Docker engine", "no Docker engine answers")
    monkeypatch.setenv("CI", "true")
    require_component("Docker engine", None)  # present: nothing happens


MODULE = """
import pytest

ASKED = []

def why():
    ASKED.append(1)
    return "dockerd is stopped"

@pytest.fixture(scope="module")
def expensive():
    raise AssertionError("a fixture was set up before the component was asked")

@pytest.mark.needs("Docker engine", why)
def test_one(expensive):
    pass

@pytest.mark.needs("Docker engine", why)
def test_two(expensive):
    pass

def test_asked_once_per_test():
    assert len(ASKED) == 2
"""


@pytest.mark.parametrize("ci", ["true", ""])
def test_the_needs_marker_is_asked_per_test_before_its_fixtures(tmp_path, ci):
    """What ``CI=true`` with dockerd stopped gives, without stopping it."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "long_rotation.py").write_text((TESTS / "long_rotation.py").read_text())
    (tmp_path / "test_needs.py").write_text(textwrap.dedent(MODULE))
    env = {"PATH": "/usr/bin:/bin", "CI": ci, "PYTHONPATH": str(TESTS.parent)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-rA", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    if ci:
        assert done.returncode == 1, out
        assert "2 errors" in out and "1 passed" in out, out
        assert out.count("Docker engine is missing under CI: dockerd is stopped "
                         "(.ci/setup installs it)") >= 2, out
    else:
        assert done.returncode == 0, out
        assert "2 skipped" in out and "1 passed" in out, out
        assert "Docker engine is missing: dockerd is stopped" in out, out
    assert "a fixture was set up" not in out, out
