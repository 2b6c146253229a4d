"""Ordeal as a team installs it (issue 43): the wheel built from this
checkout, installed with its light core into a new venv outside the
checkout, driven from an empty directory. The same venv runs ``ordeal
smoke`` against a real cluster in tests/test_external_target.py."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

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
    assert catalogue.stdout.split()[0] == "network_partition", catalogue.stdout[:500]

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
