"""Newcomer traps (issue 22): what a new user hit trying the project.

- as non-root, the nemesis smoke injected network_partition and failed after
  minutes: the session's start now names each kind that cannot run here and
  exactly why, and the smoke leaves those out;
- a bare ``pytest -m smoke`` (no path) selected nothing;
- a wheel built from the project lacked ``faults/proxy``.

(The endurance plan that cannot fit its kinds: tests/test_endurance_plan.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from faults.catalogue import (
    CAP_BITS,
    REGISTRY,
    backend_kinds,
    common_kinds,
    tools_missing,
    unrunnable_kinds,
)
from faults.schedule import is_healed_at_end, plan_schedule
from suites.test_nemesis import HOLD_S, QUIET_S, TOLERABLE, smoke_schedule

REPO = Path(__file__).resolve().parent.parent
ROOT_KINDS = {"network_partition", "packet_loss", "gpu_throttle"}


def clean_env() -> dict[str, str]:
    """This environment without the outer pytest's (xdist, addopts)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def sh(argv: list[str], cwd: Path, env: dict[str, str],
       timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


# -------------------------------------------------------------- non-root

def test_kinds_that_cannot_run_as_non_root_say_exactly_what_is_missing():
    cannot = unrunnable_kinds(1000, "cpu", cap_eff=0)
    assert set(cannot) == ROOT_KINDS, cannot
    for kind, why in cannot.items():
        assert why.startswith("needs root (effective uid 0) and this harness runs as uid "
                              "1000"), why
        assert REGISTRY[kind].privilege in why and REGISTRY[kind].without_root in why, why
    # A GPU co-tenant needs no root: gpu_throttle runs there.
    assert set(unrunnable_kinds(1000, "cuda")) == ROOT_KINDS - {"gpu_throttle"}
    # Root may run every kind; a root without CAP_NET_ADMIN (a container's)
    # not the iptables ones, and it is told so.
    assert unrunnable_kinds(0, "cpu") == {}
    full = (1 << 41) - 1
    assert unrunnable_kinds(0, "cpu", cap_eff=full, kinds=common_kinds() + backend_kinds()) == {}
    no_net = unrunnable_kinds(0, "cpu", cap_eff=full & ~(1 << CAP_BITS["CAP_NET_ADMIN"]),
                              kinds=common_kinds() + backend_kinds())
    assert set(no_net) == {"network_partition", "packet_loss", "ray_node_partition"}, no_net
    assert all(w.startswith("needs CAP_NET_ADMIN, which this root harness lacks")
               for w in no_net.values()), no_net


def test_kinds_whose_program_is_not_on_path_are_left_out_at_start_with_what_to_install():
    """The H100 machine of 2026-12-07 had no iptables: the nemesis smoke's
    network_partition failed mid-run instead of being left out at start."""
    missing = tools_missing(lambda tool: None if tool == "iptables" else f"/usr/sbin/{tool}",
                            kinds=common_kinds() + backend_kinds())
    assert missing == {"iptables"}
    assert tools_missing(lambda tool: f"/usr/sbin/{tool}") == set()
    cannot = unrunnable_kinds(0, "cuda", kinds=common_kinds() + backend_kinds(),
                              missing_tools=missing)
    assert set(cannot) == {"network_partition", "packet_loss", "ray_node_partition"}, cannot
    assert all("needs iptables, which is not on this machine's PATH (install it: apt-get "
               "install iptables)" in why for why in cannot.values()), cannot
    steps, kept, left = smoke_schedule(60.0, 0, cannot)
    assert "network_partition" in left and "network_partition" not in kept, (kept, left)


def test_the_nemesis_smoke_leaves_out_what_cannot_run_and_keeps_its_schedule():
    cannot = unrunnable_kinds(1000, "cpu")
    steps, kept, left = smoke_schedule(60.0, 0, cannot)
    assert left == {"network_partition": cannot["network_partition"]}
    assert {c.kind for c in kept} == {"process_pause", "network_latency"}
    assert steps and is_healed_at_end(steps) and len(steps) >= 2 * len(kept)
    assert not {s.kind for s in steps} & ROOT_KINDS, steps
    # As root, the schedule is the one it always was.
    root_steps, _, none_left = smoke_schedule(60.0, 0, unrunnable_kinds(0, "cpu"))
    assert none_left == {} and root_steps == plan_schedule(
        TOLERABLE, 60.0, 0, quiet_s=QUIET_S, hold_s=HOLD_S, tail_s=12, cycle=True)


def test_the_session_start_names_each_kind_that_will_not_run(tmp_path):
    """A collection of the nemesis smoke as uid 1000 (os.geteuid seen so; no
    cluster starts with --collect-only): one line per kind that cannot run."""
    code = ("import os, sys, pytest; os.geteuid = lambda: 1000; "
            "sys.exit(pytest.main(['suites/test_nemesis.py', '--collect-only', '-q', "
            "'-p', 'no:cacheprovider']))")
    done = sh([sys.executable, "-c", code], REPO, clean_env(), 180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for kind in ("network_partition", "packet_loss"):
        assert (f"fault kind {kind} will not run here: needs root (effective uid 0) and this "
                "harness runs as uid 1000") in out, out
    # (pytest_collection_finish: after collection, before any fixture or test.)


# ---------------------------------------------------- pytest -m smoke, no path

def test_a_bare_pytest_m_smoke_selects_the_smoke_suite():
    def collect(*args: str) -> subprocess.CompletedProcess[str]:
        return sh([sys.executable, "-m", "pytest", *args, "--collect-only", "-q",
                   "-p", "no:cacheprovider"], REPO, clean_env())

    done = collect("-m", "smoke")
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(i.startswith("suites/test_smoke.py::") for i in ids), ids
    assert any(i.startswith("suites/test_nemesis.py::") for i in ids), ids
    assert all(i.startswith("suites/") for i in ids), ids
    # A path given replaces testpaths: this file has no smoke test (rc 5:
    # none; one file, not tests/, whose collection takes ~8 s more).
    assert collect(str(Path(__file__).relative_to(REPO)), "-m", "smoke").returncode == 5


# ------------------------------------------------------------------ wheel

#: Run data the suites write inside the checkout (ignored by git): model
#: repositories and node-header copies there hold .py files that are not code
#: of the project (seen in CI, after the smoke steps had run).
RUN_DATA = ("reports/runs/", "reports/clusters/")

#: Every package directory of the map (docs/DEVELOPING.md) with code in it.
PACKAGE_DIRS = sorted({str(p.parent.relative_to(REPO)) for top in (
    "ordeal", "invariants", "faults", "reports", "nodes", "load", "engines", "clusters", "runs",
    "fixtures") for p in (REPO / top).rglob("*.py")
    if "__pycache__" not in p.parts and not str(p.relative_to(REPO)).startswith(RUN_DATA)})


def test_a_wheel_of_the_project_holds_every_package_and_works(tmp_path):
    """``pip install .`` (not editable) must give a working install: the
    wheel has every package and subpackage (faults/proxy/toxics, ...), and
    an install of it alone runs ``python -m faults`` and imports the fault
    proxy, from outside the repo. Built from a copy (no build/ in the
    checkout), without build isolation (no network)."""
    for must in ("faults/proxy", "faults/proxy/toxics", "engines/vllm", "engines/triton",
                 "ordeal/history", "load", "runs", "clusters", "nodes", "invariants",
                 "reports", "fixtures"):
        assert must in PACKAGE_DIRS, PACKAGE_DIRS
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for top in ("ordeal", "invariants", "faults", "reports", "nodes", "load", "engines",
                "clusters", "runs", "fixtures"):
        shutil.copytree(REPO / top, src / top, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "runs", "clusters") if top == "reports" else ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    done = sh([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
               "--no-build-isolation", "-q", "-w", str(wheels)], tmp_path, clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = wheels.glob("ordeal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # Every .py of every package, and nothing of the run data.
    want = {str(p.relative_to(REPO)) for d in PACKAGE_DIRS for p in (REPO / d).glob("*.py")}
    assert want - set(names) == set(), sorted(want - set(names))
    assert not [n for n in names if n.startswith(("reports/runs/", "reports/clusters/"))]
    # Installed alone (the venv's own ordeal is editable: the target comes first).
    target = tmp_path / "site"
    done = sh([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
               "--target", str(target), str(wheel)], tmp_path, clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    env = {**clean_env(), "PYTHONPATH": str(target)}
    check = ("import faults, faults.proxy.toxics, faults.proxy.server, fixtures.plugin, "
             "engines.vllm.adapter, engines.triton.adapter; print(faults.__file__)")
    done = sh([sys.executable, "-c", check], tmp_path, env, 120)
    assert done.returncode == 0 and done.stdout.startswith(str(target)), done.stdout + done.stderr
    done = sh([sys.executable, "-m", "faults", "catalogue"], tmp_path, env, 120)
    assert done.returncode == 0 and "network_partition" in done.stdout, done.stderr
    done = sh([sys.executable, "-m", "faults.proxy", "--help"], tmp_path, env, 120)
    assert done.returncode == 0 and "--control" in done.stdout, done.stdout + done.stderr
