"""Issue 43: one checked-in file holds a team's run options (ordeal.toml,
--stack FILE or [tool.ordeal] in pyproject.toml); the command line wins; a
mistake in the file is a usage error that names the key and what to write;
what the file set reaches the run's options and its summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ordeal.config import ConfigError
from ordeal.stack_file import OptionInfo, apply, as_argv, find

REPO = Path(__file__).resolve().parent.parent
OPTIONS = {
    "replicas": OptionInfo("--replicas", "replicas", "value", int),
    "load_rate": OptionInfo("--load-rate", "load_rate", "value", float),
    "load_duration": OptionInfo("--load-duration", "load_duration", "value", str),
    "engine": OptionInfo("--engine", "engine", "value", str, ("vllm", "triton")),
    "engine_env": OptionInfo("--engine-env", "engine_env", "many", str),
    "no_fault_proxy": OptionInfo("--no-fault-proxy", "no_fault_proxy", "switch", bool),
    "stack": OptionInfo("--stack", "stack", "value", str),
}


def stack_in(tmp_path, text, name="ordeal.toml"):
    (tmp_path / name).write_text(text)
    return find(None, tmp_path)


def test_the_file_s_values_are_converted_and_the_command_line_wins(tmp_path):
    s = stack_in(tmp_path, 'replicas = 3\nload-rate = 4\nload_duration = 90\n'
                           'engine_env = ["A=1", "B=2"]\nno-fault-proxy = true\nengine = "vllm"\n')
    applied = apply(s, OPTIONS, given={"engine"})
    assert applied.values == {"replicas": 3, "load_rate": 4.0, "load_duration": "90",
                              "engine_env": ["A=1", "B=2"], "no_fault_proxy": True}
    assert applied.overridden == ["engine"]
    assert as_argv(applied.values, OPTIONS) == [
        "--replicas", "3", "--load-rate", "4.0", "--load-duration", "90",
        "--engine-env", "A=1", "--engine-env", "B=2", "--no-fault-proxy"]
    assert len(s.sha256) == 64 and s.table == ""


def test_every_mistake_of_a_file_is_named_at_once(tmp_path):
    s = stack_in(tmp_path, 'replicaz = 3\nload_rate = "fast"\nengine = "sglang"\n'
                           'no_fault_proxy = "yes"\nreplicas = 2.5\nstack = "other.toml"\n')
    with pytest.raises(ConfigError) as e:
        apply(s, OPTIONS, set())
    text = str(e.value)
    for says in ("'replicaz' is not an option (did you mean replicas?)",
                 "load_rate = 'fast': must be a number", "engine = 'sglang': use one of vllm",
                 "no_fault_proxy = 'yes': must be true or false",
                 "replicas = 2.5: must be a whole number", "'stack' cannot name another"):
        assert says in text, (says, text)
    (tmp_path / "ordeal.toml").write_text("replicas = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        find(None, tmp_path)


def test_where_the_file_is_found(tmp_path):
    assert find(None, tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert find(None, tmp_path) is None  # a pyproject without [tool.ordeal]
    (tmp_path / "pyproject.toml").write_text('[tool.ordeal]\nreplicas = 3\n')
    s = find(None, tmp_path)
    assert s.table == "tool.ordeal" and s.values == {"replicas": 3}
    (tmp_path / "ordeal.toml").write_text("replicas = 1\n")
    assert find(None, tmp_path).values == {"replicas": 1}  # ordeal.toml first
    other = tmp_path / "team.toml"
    other.write_text("replicas = 2\n")
    assert find(str(other), tmp_path).values == {"replicas": 2}  # --stack first of all
    assert find("none", tmp_path) is None
    with pytest.raises(ConfigError, match="--stack /nope.toml: no such file"):
        find("/nope.toml", tmp_path)


def pytest_in(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "suites" / "test_smoke.py"),
                           "-m", "smoke", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(REPO), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_pytest_reads_the_file_in_its_directory_and_a_bad_value_stops_it_at_once(tmp_path):
    """The values reach the options the plugin checks at start: a bad rate
    in the file ends pytest with rc 4 and read_options' own message; the same
    rate on the command line wins over the file."""
    (tmp_path / "ordeal.toml").write_text(
        'replicas = 3\nengine_env = ["HF_TOKEN=hf_secret", "X=1"]\nload-rate = -1\n')
    bad = pytest_in(tmp_path)
    assert bad.returncode == 4, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "--load-rate -1.0: must be more than zero" in bad.stdout + bad.stderr
    ok = pytest_in(tmp_path, "--load-rate", "2")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    said = [x for x in ok.stdout.splitlines() if "stack file" in x]
    assert said and "--replicas 3" in said[0] and "HF_TOKEN=<redacted>" in said[0], ok.stdout
    assert "hf_secret" not in ok.stdout + ok.stderr
    assert "the command line overrides --load-rate" in said[0]
    (tmp_path / "ordeal.toml").write_text("replicaz = 3\n")
    typo = pytest_in(tmp_path)
    assert typo.returncode == 4 and "did you mean replicas?" in typo.stdout + typo.stderr
    assert pytest_in(tmp_path, "--stack", "none").returncode == 0


def plugin_options():
    """The plugin's real options (fixtures/plugin.py OPTIONS), declared into
    a parser that only records."""
    from fixtures import plugin

    class Group:
        def addoption(self, *names, **kw):
            pass

    class Parser:
        def getgroup(self, *a, **kw):
            return Group()

    plugin.pytest_addoption(Parser())
    return dict(plugin.OPTIONS)


@pytest.mark.parametrize("kind", ["embedded", "own-model", "own-image", "external"])
def test_every_starter_names_only_real_options_and_init_never_overwrites(tmp_path, kind):
    from ordeal.starter import starter

    options = plugin_options()
    assert {"replicas", "engine_env", "no_fault_proxy", "stack"} <= set(options)
    assert options["engine_env"].kind == "many" and options["no_fault_proxy"].kind == "switch"
    # Every key of the starter, commented ones too, is a real option with a good value.
    text = starter(kind)
    uncommented = "\n".join(line[2:] if line.startswith("# ") and " = " in line.split("#")[1]
                            else line for line in text.splitlines())
    (tmp_path / "ordeal.toml").write_text(uncommented)
    applied = apply(find(None, tmp_path), options, set())
    assert applied.values["cluster"] == {"own-image": "docker"}.get(
        kind, {"external": "external"}.get(kind, "local"))
    out = subprocess.run([sys.executable, "-m", "ordeal", "init", "--kind", kind],
                         cwd=tmp_path, capture_output=True, text=True, env={
                             "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1 and "exists: nothing written" in out.stderr  # kept
    assert (tmp_path / "ordeal.toml").read_text() == uncommented


def test_the_embedded_starter_runs_as_written(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ordeal", "init"], cwd=tmp_path,
                         capture_output=True, text=True, env={"PYTHONPATH": str(REPO),
                                                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "wrote ordeal.toml (embedded)" in out.stdout, out
    ran = pytest_in(tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "stack file" in ran.stdout and "--replicas 2" in ran.stdout
