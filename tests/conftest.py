import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from long_rotation import rotation_of

from clusters.base import note_start
from clusters.local import LocalCluster
from engines.triton.server import check as triton_missing
from ordeal.config import ClusterSpec


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Each test gets its own ledger and process records, so tests never
    reap or heal each other's (or a real run's) state."""
    monkeypatch.setenv("ORDEAL_STATE_DIR", str(tmp_path / "state"))


PY = sys.executable
# A real HTTP server process answering /health after a delay, in its own
# process group with a child of its own (like vLLM's API server + EngineCore).
HEALTH_SERVER = r"""
import http.server, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("CHILDPID=%d" % child.pid, flush=True)
time.sleep(float(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def health_server_argv():
    def argv(port: int, delay: float = 0.0) -> list[str]:
        return [PY, "-c", HEALTH_SERVER, str(port), str(delay)]
    return argv


def pids_alive(pids):
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


TESTS = Path(__file__).resolve().parent


def at_once(mode: str, setup: str, body: str, tmp_path: Path, n: int = 2,
            timeout: float = 60.0) -> list[list[str]]:
    """Run ``body`` ``n`` times at the same moment and return each run's
    result, a list of lines. ``mode`` "processes": ``n`` Python processes
    (the repo and tests/ on the path) each run ``setup`` (imports), say
    ready, wait for one go file, then run ``body``, which sets ``result``;
    ended by pid in finally. ``mode`` "threads": ``setup`` and ``body`` run
    in this process, ``n`` threads released by one barrier."""
    if mode == "threads":
        scope: dict = {}
        exec(setup, scope)
        barrier = threading.Barrier(n)
        results: list = [None] * n

        def one(i: int) -> None:
            mine = dict(scope)
            barrier.wait(timeout)
            try:
                exec(body, mine)
                results[i] = mine["result"]
            except BaseException as e:  # noqa: BLE001 - reported below
                results[i] = e
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), "a thread still runs"
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results
    go = tmp_path / f"go-{time.monotonic_ns()}"
    script = (f"{setup}\nimport json, os, time\nprint('ready', flush=True)\n"
              f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.002)\n"
              f"{body}\nprint(json.dumps(result), flush=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", script], env=env,
                                          cwd=tmp_path, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        go.touch()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, stderr
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def under_ci() -> bool:
    """``CI`` is set (``CI=true``, as CI services set it); unset, "", "0",
    "false" and "no" mean not CI."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_component(name: str, reason: str | None) -> None:
    """Call at the time of use with why ``name`` cannot be used here (None:
    it can). Under CI, where ``.ci/setup`` installs it as root, a missing or
    broken component fails the test with the reason; elsewhere the test
    skips with it."""
    if reason is None:
        return
    if under_ci():
        pytest.fail(f"{name} is missing under CI: {reason} (.ci/setup installs it)",
                    pytrace=False)
    pytest.skip(f"{name} is missing: {reason}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs(name, why): the test needs a component that .ci/setup installs; "
        "why() (reason or None) is asked when the test is set up, before its fixtures "
        "(tests/conftest.py require_component: fail under CI, skip elsewhere)")
    config.addinivalue_line(
        "markers", "long(slot, covered_by): a test over two minutes; it runs when the "
        "rotation picks its slot (tests/long_rotation.py), else covered_by says what covers "
        "its ground meanwhile; pytest tests/ -m long runs them all")


LONG_SAID = pytest.StashKey[list]()


def _rotate_long_tests(config, items):
    try:
        rotation = rotation_of(config.getoption("markexpr", "") or "")
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    named = {a for a in config.args if "::" in a}  # a test named on the command line runs
    said, keep, dropped = [], [], []
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is None:
            keep.append(item)
        elif rotation.full(mark.kwargs.get("slot", mark.args[0] if mark.args else 0)) or (
                item.nodeid in named):
            said.append(f"  {item.nodeid}: runs")
            keep.append(item)
        else:
            said.append(f"  {item.nodeid}: not this run (meanwhile: "
                        f"{mark.kwargs.get('covered_by') or 'nothing'})")
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if said:
        config.stash[LONG_SAID] = [f"long tests ({rotation.why}; pytest tests/ -m long runs "
                                   "them all):", *said]


ONE_REPLICA = pytest.StashKey[dict]()
#: The core the shared replica is bound to (its own OpenMP thread and the
#: CPU analog of GPU throttling act on it; tests/test_host_faults.py).
ONE_REPLICA_CORE = 1


@pytest.fixture(scope="session")
def one_replica(request, tmp_path_factory):
    """ONE real vLLM replica for the modules that fault a single node (host,
    kernel and link faults): every fault there heals and each test checks the
    heal it relies on, so one start serves them all (before, each module
    started its own: two starts more in every CI, issue 46). Started under
    libfaketime (a clock file) and bound to one core. It is stopped after the
    last test that uses it (``pytest_runtest_teardown``), not at the end of
    the session, so its memory is free for the clusters of later modules."""
    from engines.vllm.model import ensure_tiny_model
    from engines.vllm.nodes import VllmReplica
    from nodes.ports import free_ports
    from ordeal.topology import Endpoint

    d = tmp_path_factory.mktemp("one-replica")
    node = VllmReplica("one-replica", Endpoint("127.0.0.1", free_ports(1)[0]),
                       ensure_tiny_model(0).path, d / "replica.log", "one-replica-run",
                       cpu_core=ONE_REPLICA_CORE, clock_file=d / "replica.clock")
    held = request.config.stash.setdefault(ONE_REPLICA, {})
    # Its process record goes to a state dir of its own: in the shared default
    # one, another suite's start (reap_leftovers) would end it as a leftover.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORDEAL_STATE_DIR", str(d / "state"))
        node.start()
    held["node"] = node
    try:
        t0 = time.monotonic()
        node.wait_ready(300)
        took = time.monotonic() - t0
        note_start("local", "vllm", 1, took)  # counted with the clusters in CI's report
        print(f"\n[one_replica] ready in {took:.1f} s on {node.endpoint.url}", flush=True)
        yield node
    finally:
        _stop_one_replica(held)


def _stop_one_replica(held: dict) -> None:
    node = held.pop("node", None)
    if node is None:
        return
    if node.is_running():
        node.signal(signal.SIGCONT)  # a stopped group would not see SIGTERM
    node.stop(grace=10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the shared replica once no later test of this run uses it (not
    in an xdist worker: which tests it runs next is decided as it goes)."""
    yield
    if "one_replica" not in getattr(item, "fixturenames", ()) or hasattr(
            item.config, "workerinput"):
        return
    later = item.session.items[item.session.items.index(item) + 1:] if nextitem else []
    if not any("one_replica" in getattr(i, "fixturenames", ()) for i in later):
        _stop_one_replica(item.config.stash.get(ONE_REPLICA, {}))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """``@pytest.mark.needs(name, why)``: decided per test, before any
    fixture (a module's cluster) is started."""
    for mark in item.iter_markers("needs"):
        name, why = mark.args
        require_component(name, why())


@pytest.hookimpl(trylast=True)  # after -m/-k deselected theirs: the rotation sees what runs
def pytest_collection_modifyitems(config, items):
    """No test of the suite's own may hang CI: each gets a 10-minute cap
    (pytest-timeout), unless it sets its own. Long tests rotate
    (tests/long_rotation.py)."""
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
    _rotate_long_tests(config, items)


def pytest_collection_finish(session):
    """Say at the start which long tests run in full, reduced or not at all."""
    lines = session.config.stash.get(LONG_SAID, [])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)


@contextlib.contextmanager
def triton_cluster_of(spec: ClusterSpec, name: str, log_dir: Path):
    """A real CPU Triton cluster for a test module, or a failure that says
    what this machine lacks (bash .ci/setup installs it)."""
    missing = triton_missing()
    if missing:
        pytest.fail("a CPU Triton node cannot start here (run bash .ci/setup): "
                    + "; ".join(missing))
    with LocalCluster(spec, name, log_dir, progress=lambda m: None) as cluster:
        yield cluster


@dataclass(frozen=True)
class Installed:
    """Ordeal installed from its wheel into a virtual environment outside the
    checkout: the light core (pyproject's dependencies, no extra)."""
    venv: Path
    wheel: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, argv: list[str], cwd: Path, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` from the venv's bin/, in ``cwd``, with no trace of the
        checkout on the path (PYTHONPATH dropped)."""
        env = {k: v for k, v in (env or os.environ).items()
               if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
        return subprocess.run([self.bin(argv[0]), *argv[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def installed_ordeal(tmp_path_factory) -> Installed:
    """Build the wheel (``pip wheel .``) and install it, with its declared
    dependencies from the machine's configured index, into a new venv under
    the session's temporary directory; shared by the tests that use it."""
    root = tmp_path_factory.mktemp("installed")
    repo = Path(__file__).resolve().parent.parent
    # From a copy of the tracked files: a build in the checkout would leave
    # build/, whose stale modules a later wheel would ship.
    src = root / "src"
    tracked = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True,
                             capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (repo / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, src / name)
    built = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(root / "dist"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = (root / "dist").glob("ordeal-*.whl")
    venv = root / "venv"
    subprocess.run([PY, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return Installed(venv, wheel)
