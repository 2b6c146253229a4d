"""``--cluster docker`` against a real Docker engine: real vLLM replicas and
the real router in containers on a network of the run, every fault kind that
applies to containers seen acting and seen healed, a SIGKILLed harness
cleaned up by ``heal-all``, and clear errors when something is missing.

Needs a Docker engine (bash .ci/setup installs and starts one as root);
without one the tests skip and say so (under CI=true they fail with the
reason). About 3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from clusters.docker import DockerCluster, DockerError, unavailable_reason
from engines.vllm.model import TinyModel
from engines.vllm.nodes import SERVED_MODEL_NAME
from faults import cgroup
from faults.clock_drift import ClockDrift
from faults.gpu_throttle import GpuThrottle
from faults.iptables import chain_exists, list_chains
from faults.ledger import Ledger
from faults.network_latency import NetworkLatency
from faults.network_partition import NetworkPartition
from faults.packet_loss import PacketLoss
from faults.process_kill import ProcessKill
from faults.process_pause import ProcessPause
from load.monitor import node_journal, sample_node
from ordeal.config import ClusterSpec
from ordeal.containers import CLUSTER_LABEL, docker_client
from ordeal.ownership import reap_leftovers
from ordeal.procfs import state as proc_state
from ordeal.topology import NodeNotReady

REPO = Path(__file__).resolve().parent.parent
# Asked per test, before its fixtures: under CI a stopped engine fails the
# test with the reason (tests/conftest.py require_component), elsewhere it skips.
pytestmark = [pytest.mark.cluster, pytest.mark.needs("Docker engine", unavailable_reason)]
RUN = "dockertest"


def get(url: str, timeout: float = 3.0) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            return resp.status == 200, time.monotonic() - t0, ""
    except (urllib.error.URLError, OSError) as e:
        return False, time.monotonic() - t0, f"{type(e).__name__}: {e}"


def complete(base_url: str, timeout: float = 30.0) -> dict:
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "docker backend probe",
                       "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json",
                                          "x-request-id": f"docker-{uuid.uuid4().hex[:8]}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return {"node": resp.headers.get("x-ordeal-node"), **json.loads(resp.read())}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(backend="docker", replicas=2)
    c = DockerCluster(spec, RUN, tmp_path_factory.mktemp("docker-cluster"),
                      progress=lambda line: print(f"[docker] {line}", flush=True))
    with c:
        yield c


def client_cpuset(node):
    return docker_client().api.inspect_container(node.container_id)["HostConfig"]["CpusetCpus"]


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "ledger")


def test_the_cluster_runs_in_labelled_containers_without_capabilities(cluster):
    client = docker_client()
    described = cluster.describe()
    assert described["backend"] == "docker"
    assert described["network"]["subnet"] == str(cluster.subnet)
    for node in cluster.nodes:
        attrs = client.api.inspect_container(node.container_id)
        assert attrs["State"]["Running"], node.name
        assert attrs["Config"]["Labels"][CLUSTER_LABEL] == RUN
        assert attrs["HostConfig"]["CapDrop"] == ["ALL"] and not attrs["HostConfig"]["Privileged"]
        assert node.endpoint.host in [str(h) for h in cluster.subnet.hosts()]
    assert {x["fingerprint"].split("-")[0] for x in described["nodes"]} == {"vllm"}
    served = {complete(cluster.entrypoint.url)["node"] for _ in range(4)}
    assert served == {"replica-0", "replica-1"}  # round robin over both containers
    for node in cluster.replicas():
        # What the checkers read works in a container too: the request
        # journal (no_duplicate_execution) and the tree's memory (leak_bound).
        journal = node_journal(node)
        assert journal is not None and journal.read_text().count("\n") >= 2, journal
        assert sample_node(node)["rss_bytes"] > 300 << 20  # the API server and its engine


def test_partition_is_cut_inside_the_container_and_healed(cluster, ledger):
    victim, other = cluster.replicas()
    assert get(victim.endpoint.url + "/health")[0]
    fault = NetworkPartition(victim, RUN, ledger, mode="reject")
    with fault:
        chain = fault.chain
        ok, _, why = get(victim.endpoint.url + "/health")
        assert not ok and ("refused" in why.lower() or "reset" in why.lower()), why
        assert get(other.endpoint.url + "/health")[0]
        assert chain_exists(chain, victim.netns_pid())  # in the container's namespace
        assert chain not in [c.name for c in list_chains()]  # not on the host
        assert ledger.pending()[0].inverse["containers"] == [victim.container_id]
    assert get(victim.endpoint.url + "/health")[0]
    assert not chain_exists(chain, victim.netns_pid())
    assert ledger.pending() == []


def test_packet_loss_drops_inside_the_container_and_heals(cluster, ledger):
    victim = cluster.replicas()[0]
    fault = PacketLoss(victim, RUN, ledger, probability=0.5)
    with fault:
        for _ in range(10):
            get(victim.endpoint.url + "/health", timeout=1.0)
        loss = fault.loss()
    assert loss.seen > 0 and loss.dropped > 0, loss
    assert get(victim.endpoint.url + "/health")[0]


def test_pause_stops_every_process_of_the_container_and_heals(cluster, ledger):
    victim = cluster.replicas()[0]
    pids = victim.pids()
    assert len(pids) >= 2  # docker-init, the API server, EngineCore ...
    with ProcessPause(victim, RUN, ledger):
        assert {proc_state(p) for p in pids} == {"T"}
        assert not get(victim.endpoint.url + "/health", timeout=1.5)[0]
    assert "T" not in {proc_state(p) for p in pids}
    assert get(victim.endpoint.url + "/health")[0]


def test_link_latency_through_the_proxy_on_the_gateway(cluster, ledger):
    link = cluster.link("router-replica-0")
    before = min(get(link.listen.url + "/health")[1] for _ in range(3))
    with NetworkLatency(link, RUN, ledger, latency_ms=300):
        during = min(get(link.listen.url + "/health")[1] for _ in range(3))
    after = min(get(link.listen.url + "/health")[1] for _ in range(3))
    assert during >= before + 0.25, (before, during)
    assert after < during - 0.2, (during, after)


def test_clock_drift_moves_the_container_clock_and_heals(cluster, ledger):
    victim = cluster.replicas()[0]

    def skew() -> float:
        return complete(victim.endpoint.url)["created"] - time.time()
    assert abs(skew()) < 5
    with ClockDrift(victim, RUN, ledger, mode="offset", offset_s=3600):
        deadline = time.monotonic() + 10
        while abs(skew() - 3600) > 5 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert abs(skew() - 3600) < 5
    deadline = time.monotonic() + 10
    while abs(skew()) > 5 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert abs(skew()) < 5


def tokens_per_s(url: str, runs: int = 4, max_tokens: int = 48) -> float:
    """Median throughput of a fixed greedy request (always max_tokens tokens)."""
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "throughput", "temperature": 0,
                       "max_tokens": max_tokens, "ignore_eos": True}).encode()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == max_tokens
        out.append(max_tokens / (time.perf_counter() - t))
    return statistics.median(out)


def test_cpu_quota_throttles_the_container_and_the_heal_puts_it_back(cluster, ledger):
    """gpu_throttle's CPU analog on a container: its processes go into a
    cgroup of the suite's with a 20% quota, and back into the container's
    own cgroup on heal (Docker still accounts them there afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("moving a container's processes between cgroups needs root")
    victim = cluster.replicas()[0]
    pids = victim.pids()
    ctl = cgroup.cpu_controller()
    original = {p: cgroup.cgroup_of(p, ctl) for p in pids}
    assert all(victim.container_id in str(path) for path in original.values()), original
    tokens_per_s(victim.endpoint.url, runs=1)  # warm up
    before = tokens_per_s(victim.endpoint.url)
    fault = GpuThrottle(victim, RUN, ledger, backend="cpu", cpu_fraction=0.2)
    injected = fault.inject()
    try:
        assert sorted(injected["moved_pids"]) == sorted(pids)
        during = tokens_per_s(victim.endpoint.url)
    finally:
        healed = fault.heal()
    after = tokens_per_s(victim.endpoint.url)
    assert {p: cgroup.cgroup_of(p, ctl) for p in pids} == original
    assert healed["cpu_stat"]["nr_throttled"] > 0, healed
    assert during < 0.6 * before and after > 1.5 * during, (before, during, after)
    print(f"[docker] cpu quota 20%: {before:.0f} -> {during:.0f} -> {after:.0f} tokens/s")


def test_kill_exits_the_container_and_the_heal_restarts_it(cluster, ledger):
    """Made slower than Docker's own wait: the container's shim (the engine's
    process that carries the kill and reports the exit, for this container
    only) is stopped for 13 s, so ``docker kill`` does not answer within
    10 s. The fault still succeeds, confirmed from the container's state,
    and records what Docker said."""
    victim = cluster.replicas()[1]
    ip = victim.endpoint.host
    shim = int(Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert Path(f"/proc/{shim}/comm").read_text().startswith("containerd-shim")
    fault = ProcessKill(victim, RUN, ledger, restart=True, ready_timeout_s=240)
    os.kill(shim, signal.SIGSTOP)
    resume = threading.Timer(13, os.kill, (shim, signal.SIGCONT))
    resume.start()
    try:
        injected = fault.inject()
    finally:
        resume.cancel()
        os.kill(shim, signal.SIGCONT)
    try:
        assert injected["gone_after_s"] > 10, injected
        assert "no answer within 10 s" in injected.get("engine_said", ""), injected
        assert not victim.is_running() and victim.exit_code() == 137
        assert victim.pids() == []
        assert not get(victim.endpoint.url + "/health", timeout=1.0)[0]
    finally:
        fault.heal()
    assert victim.is_running() and victim.endpoint.host == ip
    assert get(victim.endpoint.url + "/health")[0]
    assert complete(victim.endpoint.url)["choices"]
    # The restarted container keeps its own core (--replica-cpus own): its
    # cpuset, and the affinity of every process in it, as recorded.
    recorded = {n["name"]: n["cpus"] for n in cluster.describe()["nodes"]}
    for node in cluster.replicas():
        cpus = recorded[node.name]
        assert client_cpuset(node) == ",".join(map(str, cpus)), (node.name, cpus)
        assert {tuple(sorted(os.sched_getaffinity(p))) for p in node.pids()} == {tuple(cpus)}
    assert not set(recorded["replica-0"]) & set(recorded["replica-1"]), recorded
    assert recorded["router"] == "all"


def test_a_missing_image_is_a_clear_error_before_anything_is_made(tmp_path):
    spec = ClusterSpec(backend="docker", replicas=1, docker_image="ordeal-no-such-image:1")
    c = DockerCluster(spec, "dockermissing", tmp_path)
    with pytest.raises(DockerError, match="is not in this Docker engine .*docker load"):
        c.start()
    c.stop()
    assert docker_client().containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}=dockermissing"}) == []


def test_a_container_that_exits_at_start_says_why(tmp_path):
    """A replica whose model directory is empty exits at once: the error
    names the node, its exit code and its last log lines."""
    empty = tmp_path / "no-model"
    empty.mkdir()
    model = TinyModel(path=empty, seed=0, sha256="0")
    spec = ClusterSpec(backend="docker", replicas=1, ready_timeout_s=120)
    c = DockerCluster(spec, "dockerexit", tmp_path / "logs", model=model)
    with pytest.raises(NodeNotReady) as err:
        with c:
            pass
    text = str(err.value)
    assert "replica-0" in text and "exited with code" in text and "docker logs" in text, text
    assert docker_client().containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}=dockerexit"}) == []


def test_no_docker_engine_is_a_clear_error_not_a_stack_trace(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-such.sock",
           "ORDEAL_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           str(REPO / "suites" / "test_smoke.py"), "-m", "smoke", "--cluster",
                           "docker", "--runs-dir", str(tmp_path / "runs"), "-x", "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "--cluster docker: no Docker engine answers" in out and "apt-get install docker.io" in out
    assert "Traceback" not in out


CRASHING_HARNESS = r"""
import sys, time
from pathlib import Path
from clusters.docker import DockerCluster
from faults.ledger import Ledger
from faults.network_partition import NetworkPartition
from ordeal.config import ClusterSpec
c = DockerCluster(ClusterSpec(backend="docker", replicas=1), sys.argv[1], Path(sys.argv[2]))
c.start()
NetworkPartition(c.replicas()[0], sys.argv[1], Ledger()).inject()
print("INJECTED", c.replicas()[0].container_id, flush=True)
time.sleep(600)
"""


@pytest.mark.long(slot=1, covered_by="the SIGKILLed harnesses of tests/test_kernel_faults.py, "
                  "test_link_faults.py, test_host_faults.py and test_ray_backend.py, healed "
                  "by heal_all; this module's container labels and heals")
def test_a_sigkilled_harness_leaves_nothing_after_heal_all(tmp_path):
    run = f"dockercrash{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "ORDEAL_STATE_DIR": os.environ["ORDEAL_STATE_DIR"],
           "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CRASHING_HARNESS, run, str(tmp_path / "logs")],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    client = docker_client()
    try:
        line = ""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not line.startswith("INJECTED"):
            line = child.stdout.readline() or line
            if child.poll() is not None:
                break
        assert line.startswith("INJECTED"), f"the child harness did not inject (rc {child.poll()})"
        container = line.split()[1]
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        left = client.containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}={run}"})
        assert container in [c.id for c in left] and len(left) == 2  # replica and router
    finally:
        if child.poll() is None:
            child.kill()
    done = subprocess.run([sys.executable, "-m", "faults", "heal-all"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "healed network_partition" in done.stdout and "removed leftover container" in done.stdout
    # The fault proxy was a host process of the dead harness: heal-all ends
    # it too, by its recorded group (ordeal.ownership), before it heals.
    assert "leftover process(es) of fault-proxy" in done.stdout, done.stdout
    assert client.containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}={run}"}) == []
    assert client.networks.list(filters={"label": f"{CLUSTER_LABEL}={run}"}) == []
    assert Ledger().pending() == []
    assert reap_leftovers() == []


def test_the_node_header_s_files_import_alone(tmp_path):
    """What the Docker engine image gets of Ordeal (the middleware and its
    imports, engines/vllm/node_header.py FILES, laid out as clusters/docker.py
    does) imports with nothing else of Ordeal on the path: a module the
    middleware imports and FILES forgot (ordeal/planted.py once) failed every
    replica of --docker-engine image at start."""
    from engines.vllm.node_header import FILES

    for rel in FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    for pkg in ("engines", "engines/vllm", "ordeal"):
        (tmp_path / pkg / "__init__.py").write_text("")
    # -S: no site-packages, so no editable install of the checkout to fall back on.
    done = subprocess.run([sys.executable, "-S", "-c", "import engines.vllm.node_header as m; "
                           "print(m.NodeHeaderMiddleware.__name__)"], cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "NodeHeaderMiddleware", done.stderr
