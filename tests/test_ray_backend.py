"""``--cluster ray`` against a real Ray cluster (Ray 2.60's own gcs_server and
raylets, simulated nodes on this machine) with real vLLM replicas: replicas
on different Ray nodes, every Ray address on loopback, a lost node's replica
rescheduled by Ray with its recovery time measured, a paused node healed,
an existing process fault acting on a Ray replica, load workers as actors
on the Ray nodes (``--load-workers`` on this backend), a SIGKILLed harness
cleaned up by ``heal-all``, and clear errors for an address outside the
allowed set and a Ray cluster that cannot start.

Needs Ray (`pip install 'ray[serve]==2.60.0'`); without it the tests skip
and say so (under CI=true they fail with the reason). One module-scoped cluster of 2 nodes with 1 replica each;
about 3-4 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest

from clusters.ray import RayCluster
from clusters.ray_nodes import RayPorts
from clusters.ray_runtime import RayError, check_loopback, unavailable_reason
from conftest import require_component
from engines.vllm.nodes import SERVED_MODEL_NAME
from faults import iptables
from faults.base import FaultError
from faults.ledger import Ledger
from faults.process_kill import ProcessKill
from faults.ray_node import RayNodeLoss, RayNodePartition, RayNodePause, partition_rules, port_lists
from load.plan import plan_requests
from load.spec import WorkloadSpec
from load.workers import run_in_workers
from load.workload import WorkloadRunner
from ordeal import cgroup2, procfs
from ordeal.config import ClusterSpec, ConfigError
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from ordeal.ownership import CLUSTER_ENV

REPO = Path(__file__).resolve().parent.parent
needs_ray = pytest.mark.needs("Ray", unavailable_reason)  # asked per test, at set-up


def complete(url: str, prompt: str = "hello", timeout: float = 30.0) -> tuple[str, str]:
    """(text, x-ordeal-node) of one greedy completion."""
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 8,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())["choices"][0]["text"], resp.headers.get("x-ordeal-node")


def run_processes(run: str) -> list[int]:
    """Every live process labelled with ``run`` or in a group the run's
    records name (EngineCore and Ray workers rename themselves)."""
    out = []
    for p in psutil.process_iter():
        try:
            if procfs.environ(p.pid).get(CLUSTER_ENV) == run:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


@pytest.fixture(scope="module")
def ray_state(tmp_path_factory):
    """One state dir for the whole module: the module's cluster writes
    process records at start and again when a node restarts inside a test,
    and conftest's per-test dir would split them (a record of the first
    start was left in the old dir)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORDEAL_STATE_DIR", str(tmp_path_factory.mktemp("ray-state")))
        yield


@pytest.fixture(autouse=True)
def isolated_state(ray_state):
    """Overrides conftest's per-test state dir with the module's."""


# -- no cluster needed ------------------------------------------------------

def test_ray_options_are_checked_up_front():
    with pytest.raises(ConfigError, match="--cluster ray only"):
        ClusterSpec(backend="local", ray_nodes=2)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        ClusterSpec(backend="ray", ray_address="somewhere")
    with pytest.raises(ConfigError, match="1..16"):
        ClusterSpec(backend="ray", ray_nodes=99)
    ClusterSpec(backend="ray", ray_address="127.0.0.1:6379", ray_nodes=3)


def test_an_address_outside_the_allowed_set_is_refused_before_connecting(tmp_path):
    with pytest.raises(RayError, match=r"192\.0\.2\.7:6379 is not allowed.*--allow-target"):
        check_loopback("--ray-address", ["192.0.2.7:6379"])
    check_loopback("--ray-address", ["127.0.0.1:6379", "127.0.0.1"])
    if unavailable_reason() is None:
        c = RayCluster(ClusterSpec(backend="ray", replicas=1, ray_address="10.9.8.7:6379"),
                       "raybad", tmp_path)
        c.model = object()  # type: ignore[assignment] - never reached: refused first
        t0 = time.monotonic()
        with pytest.raises(RayError, match="10.9.8.7:6379 is not allowed"):
            c.start()
        assert time.monotonic() - t0 < 5
        c.stop()


@needs_ray
@pytest.mark.cluster
@pytest.mark.long(slot=1, covered_by="a start that fails with its reason: "
                  "tests/test_real_cluster.py (replicas that never get ready) and "
                  "tests/test_docker_backend.py (a container that exits at start)")
def test_a_ray_cluster_that_cannot_start_says_why(tmp_path, monkeypatch):
    """The head's GCS port is taken: the head exits and the error names the
    node, its exit and its log, and nothing of the attempt is left."""
    import clusters.ray as rc

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real = rc.free_ports
    monkeypatch.setattr(rc, "free_ports",
                        lambda n, host="127.0.0.1": [*real(n - 1, host), taken])
    run = f"raynostart{uuid.uuid4().hex[:6]}"
    c = RayCluster(ClusterSpec(backend="ray", replicas=1), run, tmp_path)
    c.model = object()  # type: ignore[assignment] - the head fails first
    try:
        with pytest.raises(RayError, match=r"Ray node ray-head exited with code"):
            c.start()
    finally:
        c.stop()
        holder.close()
    assert run_processes(run) == []
    assert c.temp_dir is not None and not c.temp_dir.exists()
    assert f"/{c.temp_dir.name}" not in cgroup2.ours(), "teardown left the nodes' cgroups"


# -- one real cluster: 2 simulated nodes, 1 replica each --------------------

def test_partition_rules_cut_a_node_s_cgroup_from_its_peers_ray_ports_both_ways():
    node = RayPorts((101, 102, 103), (2000, 2023))
    head = RayPorts(tuple(range(201, 210)), (3000, 3023))
    rules = partition_rules("/ordeal-ray-x/ray-node-0", node, [head])
    assert rules == [
        ("-p", "tcp", "-m", "cgroup", "--path", "/ordeal-ray-x/ray-node-0", "-m", "multiport",
         "--dports", "201,202,203,204,205,206,207,208,209,3000:3023", "-j", "DROP"),
        ("-p", "tcp", "-m", "multiport", "--dports", "101,102,103,2000:2023",
         "-m", "cgroup", "!", "--path", "/ordeal-ray-x/ray-node-0", "-j", "DROP")]
    with pytest.raises(FaultError, match="must be a path under the cgroup v2 root"):
        partition_rules("ordeal-ray-x", node, [head])


def test_port_lists_respect_multiport_s_fifteen_slots():
    many = RayPorts(tuple(range(1, 15)), (100, 200))  # 14 ports + a range (2 slots)
    lists = port_lists(many)
    assert lists == [",".join(str(p) for p in range(1, 15)), "100:200"]
    assert all(sum(2 if ":" in x else 1 for x in lst.split(",")) <= 15 for lst in lists)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, ray_state):
    require_component("Ray", unavailable_reason())
    run = f"raytest{uuid.uuid4().hex[:6]}"
    c = RayCluster(ClusterSpec(backend="ray", replicas=2, ray_nodes=2), run,
                   tmp_path_factory.mktemp("ray") / "logs")
    with c:
        yield c
    assert run_processes(run) == [], "teardown left processes of the run"
    from ordeal.config import state_dir
    assert not list((state_dir() / "procs").glob(f"{run}-*")), "teardown left process records"
    assert c.temp_dir is not None and not c.temp_dir.exists()


@pytest.mark.cluster
def test_replicas_run_on_different_ray_nodes_all_on_loopback(cluster):
    d = cluster.describe()
    assert d["backend"] == "ray"
    placed = {n["name"]: n["ray_node"] for n in d["nodes"] if n["role"] == "replica"}
    assert sorted(placed.values()) == ["ray-node-0", "ray-node-1"], placed
    assert [n["name"] for n in d["ray"]["nodes"]] == ["ray-head", "ray-node-0", "ray-node-1"]
    assert d["ray"]["address"].startswith("127.0.0.1:")
    # Every socket any process of the Ray nodes listens on is loopback.
    pids = {p for n in [cluster.head, *cluster.ray_nodes] for p in n.pids()}
    listening = [c for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "no listening socket found for the Ray nodes"
    outside = [(c.pid, c.laddr) for c in listening
               if c.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert outside == [], f"Ray listens outside loopback: {outside}"
    text, node = complete(cluster.entrypoint.url)
    assert text and node in placed


@pytest.mark.cluster
def test_load_workers_run_as_actors_on_the_ray_nodes(cluster, tmp_path):
    """--load-workers on --cluster ray: each worker a Ray actor on a Ray
    node (a process of the run's nodes, not a child of the harness), its
    ops into the one history; the actors are gone after the load."""
    h = History(tmp_path / "h.jsonl")
    spec = WorkloadSpec(duration_s=5, rate=6, seed=21, max_tokens=(4, 8))
    said: list[str] = []
    seen: dict[int, tuple[bool, int]] = {}  # pid -> (a process of the run's nodes, its parent)

    def note(line: str) -> None:  # while the workers run: their processes, then
        said.append(line)
        if "Ray actors (pids" in line:
            ours = set(run_processes(cluster.cluster_id))
            for pid in (int(x) for x in line.split("(pids ", 1)[1].rstrip(")").split(", ")):
                seen[pid] = (pid in ours, psutil.Process(pid).ppid())

    runner = WorkloadRunner(spec, cluster.entrypoint.url, h, progress=note)
    launcher = cluster.load_worker_launcher()
    cluster.progress, shown = said.append, cluster.progress
    try:
        asyncio.run(run_in_workers(runner, 2, launcher=launcher))
    finally:
        cluster.progress = shown
        h.close()
    assert launcher.placed == ["ray-node-0", "ray-node-1"], (launcher.placed, said)
    assert len(seen) == 2 and all(ours and parent != os.getpid()
                                  for ours, parent in seen.values()), (seen, said)
    pids = list(seen)
    ops = list(read_history(tmp_path / "h.jsonl"))
    invokes = [o for o in ops if o.type == "invoke"]
    assert sorted(o.value["seq"] for o in invokes) == [
        r.seq for r in plan_requests(spec, limit_s=spec.duration_s)]
    assert Counter(o.value["worker"] for o in invokes).keys() == {0, 1}
    assert all(o.type == "ok" for o in ops if o.type != "invoke"), ops[-1]
    assert not runner.worker_errors, runner.worker_errors
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(psutil.pid_exists(p) for p in pids), "a load worker actor outlived the load"


@pytest.mark.cluster
def test_a_process_fault_acts_on_a_ray_replica_unchanged(cluster):
    r = cluster.node("replica-1")
    before = r.pid
    kill = ProcessKill(r, cluster.cluster_id, Ledger(), ready_timeout_s=240)
    kill.inject()
    assert not r.is_running()
    healed = kill.heal()
    assert healed["restarted"] and r.is_running() and r.pid != before
    assert complete(r.endpoint.url)[0]


@pytest.mark.cluster
@pytest.mark.long(slot=2, covered_by="one Ray node fault per slot (lost, paused, partitioned); "
                  "a process fault on a Ray replica and the module's cluster in every CI")
def test_a_lost_node_s_replica_is_rescheduled_and_its_recovery_measured(cluster, capsys):
    victim = cluster.node("replica-0")
    node = cluster.ray_node_of(victim)
    assert node is not None
    old_node_id, old_pid = node.node_id, victim.pid
    other = next(n for n in cluster.ray_nodes if n is not node)
    loss = RayNodeLoss(node, cluster.cluster_id, Ledger(), ready_timeout_s=240)
    loss.inject()
    assert not node.is_running() and procfs.state(old_pid) in (None, "Z")
    # Ray (not the suite) moves the replica: watch it serve on the other node
    # while the lost one is still down, and time it from the kill.
    rescheduled_s = cluster.wait_rescheduled(victim, away_from=old_node_id, timeout=240)
    assert victim.node_id == other.node_id and victim.pid != old_pid
    assert complete(cluster.entrypoint.url)[0]
    healed = loss.heal()
    assert healed["node_restarted"] and node.is_running() and node.node_id != old_node_id
    moved = healed["replicas"]["replica-0"]
    assert moved["moved"] and moved["now_on"] == other.name
    with capsys.disabled():
        print(f"\n[ray] node loss: replica-0 rescheduled from {node.name} to {other.name} and "
              f"serving {rescheduled_s:.1f}s after the kill; {node.name} back in "
              f"{healed['node_up_after_s']}s; heal {healed['heal_s']}s")
    assert rescheduled_s < 240


@pytest.mark.cluster
@pytest.mark.long(slot=1, covered_by="one Ray node fault per slot (lost, paused, partitioned); "
                  "a process fault on a Ray replica and the module's cluster in every CI")
def test_a_node_paused_past_ray_s_verdict_loses_its_replicas_and_heals(cluster, capsys):
    """Paused longer than Ray's dead-node verdict (~3 s here): Ray moves the
    node's replicas while their paused engines still hold the ports; heal
    ends those orphans, the actors start fresh engines where Ray put them,
    and the node comes back if Ray told it to exit."""
    node = cluster.ray_nodes[1]
    old_id = node.node_id
    on_it = sorted(r.name for r in node.engines_refreshed())
    assert on_it, "no replica on the node to pause (the node-loss test moves replica-0 here)"
    pause = RayNodePause(node, cluster.cluster_id, Ledger(), ready_timeout_s=240)
    pause.inject()
    assert [p for p in node.pids() if procfs.state(p) == "T"], "nothing of the node is stopped"
    time.sleep(8)
    healed = pause.heal()
    assert sorted(healed["orphans_ended"]) == on_it, healed
    assert node.is_running() and node.node_id != old_id  # Ray's verdict stood: a new node
    for r in cluster.replicas():
        r.wait_ready(120)
        assert complete(r.endpoint.url)[0]
    assert all(v["moved"] for v in healed["replicas"].values()), healed
    with capsys.disabled():
        print(f"\n[ray] node pause 8 s: {on_it} moved off {node.name}, serving "
              f"{[v['serving_after_inject_s'] for v in healed['replicas'].values()]}s after the "
              f"pause began; heal {healed['heal_s']}s")


@pytest.mark.cluster
@pytest.mark.long(slot=0, covered_by="one Ray node fault per slot (lost, paused, partitioned); "
                  "a process fault on a Ray replica and the module's cluster in every CI")
def test_a_node_partitioned_from_the_head_is_declared_dead_and_heals(cluster, capsys):
    """Cut from the head (iptables on the node's cgroup and Ray's ports):
    the GCS's health checks fail, Ray declares the node dead and restarts
    its actors elsewhere, while its engines, whose serving ports are not
    cut, still answer. Heal removes the rules, ends those orphans, and every
    replica serves again with the node back in the cluster."""
    require_component("iptables (ray_node_partition)", iptables.unavailable_reason())
    if cgroup2.unavailable_reason():  # the kernel's, not something .ci/setup installs
        pytest.skip(f"ray_node_partition needs cgroup v2 as root: {cgroup2.unavailable_reason()}")
    ray = sys.modules["ray"]
    node = next((n for n in cluster.ray_nodes if n.engines_refreshed()), None)
    assert node is not None and node.cgroup, "no Ray node with a replica and a cgroup"
    assert node.pid in cgroup2.procs(cgroup2.mount_point() / node.cgroup.lstrip("/"))
    on_it, old_id = sorted(r.name for r in node.engines()), node.node_id
    part = RayNodePartition(node, cluster.cluster_id, Ledger(), ready_timeout_s=240)
    part.inject()
    t0, declared_s = time.monotonic(), None
    while time.monotonic() < t0 + 60:
        if {n["NodeID"]: n["Alive"] for n in ray.nodes()}.get(old_id) is False:
            declared_s = time.monotonic() - t0
            break
        time.sleep(0.5)
    assert declared_s is not None, "Ray never declared the partitioned node dead in 60 s"
    assert part.dropped() > 0
    # Only Ray's control plane is cut: the old engines still answer.
    assert complete(cluster.entrypoint.url)[0]
    healed = part.heal()
    assert healed["existed"] and healed["dropped_packets"] > 0, healed
    assert healed["chain"] not in [c.name for c in iptables.list_chains()]
    assert sorted(healed["orphans_ended"]) == on_it, healed
    assert node.is_running() and node.node_id != old_id  # Ray's verdict stood: a new node
    for r in cluster.replicas():
        r.wait_ready(120)
        assert complete(r.endpoint.url)[0]
    with capsys.disabled():
        print(f"\n[ray] node partition: {node.name} declared dead {declared_s:.1f}s after the "
              f"cut ({healed['dropped_packets']} packets dropped); {on_it} serving "
              f"{[v['serving_after_inject_s'] for v in healed['replicas'].values()]}s after "
              f"the cut began; heal {healed['heal_s']}s")


@pytest.mark.cluster
def test_a_node_without_replicas_declared_dead_is_started_again(cluster):
    """Paused past Ray's verdict with no replica on it: nothing to move or
    end, yet Ray's verdict stands and the raylet leaves once it hears it.
    The heal must start the node again (an endurance run once left such a
    node down, and every later fault on it was refused)."""
    node = next((n for n in cluster.ray_nodes if not n.engines_refreshed()), None)
    assert node is not None, "every Ray node runs a replica (the earlier tests move them)"
    old_id = node.node_id
    pause = RayNodePause(node, cluster.cluster_id, Ledger(), ready_timeout_s=240)
    pause.inject()
    # Held until Ray's verdict, however late it comes: a node started a
    # moment ago (an earlier test's heal) is not health-checked at once.
    deadline = time.monotonic() + 60
    time.sleep(8)
    while not node.declared_dead() and time.monotonic() < deadline:
        time.sleep(1)
    healed = pause.heal()
    assert healed["declared_dead"] is True and healed["orphans_ended"] == [], healed
    assert healed.get("node_restarted") and node.is_running() and node.node_id != old_id, healed
    assert not node.declared_dead()
    assert complete(cluster.entrypoint.url)[0]


@needs_ray
@pytest.mark.cluster
def test_node_faults_refuse_the_head_and_non_ray_nodes(cluster):
    with pytest.raises(FaultError, match="is the Ray head"):
        RayNodeLoss(cluster.head, "x", Ledger()).inject()
    with pytest.raises(FaultError, match="not a Ray node"):
        RayNodeLoss(cluster.node("replica-0"), "x", Ledger()).inject()


CRASHING_HARNESS = r"""
import sys, time
from pathlib import Path
from clusters.ray import RayCluster
from ordeal.config import ClusterSpec
c = RayCluster(ClusterSpec(backend="ray", replicas=1, ray_nodes=1), sys.argv[1], Path(sys.argv[2]),
               progress=lambda s: print(s, flush=True))
c._wait_all = lambda replicas: print("PLACED", c.temp_dir, flush=True) or time.sleep(600)
c.start()
"""


@needs_ray
@pytest.mark.cluster
def test_a_sigkilled_harness_leaves_nothing_after_heal_all(tmp_path):
    """Killed once the Ray nodes run and the replica actor has spawned its
    engine: heal-all ends the nodes, the actor's engine and the temp dir."""
    run = f"raycrash{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CRASHING_HARNESS, run,
                              str(tmp_path / "logs")], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, text=True)
    temp_dir = None
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and not line.startswith("PLACED"):
            line = child.stdout.readline() or line
            if child.poll() is not None:
                break
        assert line.startswith("PLACED"), f"the child harness did not start (rc {child.poll()})"
        temp_dir = Path(line.split()[1])
        # Wait until the actor has spawned the engine (its record appears).
        engine = None
        while time.monotonic() < deadline and engine is None:
            engine = next((p for p in run_processes(run) if "vllm" in " ".join(
                psutil.Process(p).cmdline())), None)
            time.sleep(0.5)
        assert engine, "the replica actor never started its engine"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        time.sleep(1)
        assert run_processes(run), "the Ray nodes should outlive their harness"
    finally:
        if child.poll() is None:
            child.kill()
    done = subprocess.run([sys.executable, "-m", "faults", "heal-all"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ray-head" in done.stdout and "replica-0" in done.stdout, done.stdout
    assert f"removed leftover Ray temp dir {temp_dir}" in done.stdout, done.stdout
    if cgroup2.unavailable_reason() is None:
        assert f"removed leftover cgroup /{temp_dir.name}" in done.stdout, done.stdout
        assert f"/{temp_dir.name}" not in cgroup2.ours()
    deadline = time.monotonic() + 15
    while run_processes(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run_processes(run) == []
    assert temp_dir is not None and not temp_dir.exists()
