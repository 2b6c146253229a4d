"""``--cluster external --target FILE``: a cluster Ordeal did not start,
driven, broken through the user's hooks and judged (issue 24).

The deployment here is started by plain shell scripts, not by Ordeal's
cluster API: two real vLLM replicas and the real vllm-router, each launched
by a ``start-<node>.sh`` that writes its pid and execs the server, run under
``setsid`` (so that pid is its group's id). The target file's hooks kill
(``kill -KILL`` the group), restart (``setsid bash start-<node>.sh &``, a
hook that returns at once: issue 47), pause
(``kill -STOP``) and resume (``kill -CONT``) them. The smoke suites then run
against it in a pytest of their own, as a user would run them, with an API
key in the environment that no file of the run may contain. Their load is
light (3 requests/s, 20 s before the kill smoke's restart): the two replicas
share two cores with the session's cluster, and a restart's time is judged
(restart_readiness) as it is.

The hook failures (non-zero exit, a hang past the timeout, garbage output)
and heal-all after a SIGKILLed harness are tested on hooks that touch only
marker files: what is checked there is the hook machinery, not a node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from multidict import CIMultiDict
from toxiproxy import Toxiproxy

from clusters.external import toxiproxy_links
from engines.vllm.model import ensure_tiny_model
from engines.vllm.nodes import SERVER_MODULE, replica_env, router_executable
from faults.base import FaultError
from faults.heal_all import heal_all
from faults.hook import HookFault
from faults.ledger import Ledger
from faults.network_latency import NetworkLatency
from faults.proxy.launch import ProxyProcess
from invariants.known import embedded_file
from load.client import ClientOptions, Outcome, scrubbed
from nodes.external import ExternalNode
from nodes.ports import free_ports
from nodes.waits import http_get
from ordeal.config import ConfigError
from ordeal.target import Hook, read_target_file
from ordeal.topology import Endpoint

REPO = Path(__file__).resolve().parent.parent
SECRET = "sk-ordeal-test-0123456789abcdef"


def start_script(path: Path, argv: list[str], env: dict[str, str], log: Path,
                 pidfile: Path) -> None:
    """A start script as a team writes one: it writes its pid and execs the
    server, output to ``log``. Run under ``setsid`` (the heal hook's
    ``setsid bash start.sh &``, issue 47), that pid is its group's id."""
    exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in env.items()
                      if k.isidentifier())
    path.write_text(f"#!/bin/bash\n{exports}echo $$ > {json.dumps(str(pidfile))}\n"
                    "exec " + " ".join(json.dumps(a) for a in argv)
                    + f" >> {json.dumps(str(log))} 2>&1 < /dev/null\n")


def wait_health(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_get(url, timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {timeout}s")


def end_group(pidfile: Path) -> None:
    """End the group this test started (its id is in ``pidfile``)."""
    try:
        pgid = int(pidfile.read_text())
        os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="module")
def plain_stack(tmp_path_factory):
    """Two vLLM replicas and vllm-router, started by shell scripts; the
    target file naming them, with shell hooks."""
    d = tmp_path_factory.mktemp("external-stack")
    model = ensure_tiny_model(0)
    p0, p1, pr, pm = free_ports(4, "127.0.0.1")
    nodes = {"replica-0": p0, "replica-1": p1}
    cores = sorted(os.sched_getaffinity(0))
    for i, (name, port) in enumerate(nodes.items()):
        env = replica_env({}, cpu_core=cores[i % len(cores)])
        env.pop("PYTHONPATH", None)  # not Ordeal's: no node header middleware either
        argv = [sys.executable, "-m", SERVER_MODULE, "--model", str(model.path),
                "--served-model-name", "ordeal-tiny", "--host", "127.0.0.1",
                "--port", str(port), "--max-model-len", "512", "--dtype", "float32",
                "--enforce-eager", "--disable-uvicorn-access-log"]
        start_script(d / f"start-{name}.sh", argv, env, d / f"{name}.log", d / f"{name}.pid")
    # The user's Toxiproxy between the router and the replicas: Ordeal's proxy
    # started bare and filled over its Toxiproxy API by toxiproxy-python.
    toxiproxy = ProxyProcess([], stderr_path=d / "toxiproxy.log").start()
    server = Toxiproxy()
    server.update_api_consumer(toxiproxy.control.host, toxiproxy.control.port)
    listens = [server.create(upstream=f"127.0.0.1:{port}", name=f"vllm-{i}",
                             listen="127.0.0.1:0").listen
               for i, port in enumerate(nodes.values())]
    router = [router_executable(), "--host", "127.0.0.1", "--port", str(pr), "--worker-urls",
              *(f"http://{listen}" for listen in listens), "--policy", "round_robin",
              "--health-check-interval-secs", "1", "--health-check-timeout-secs", "2",
              "--cb-timeout-duration-secs", "5", "--prometheus-port", str(pm)]
    start_script(d / "start-router.sh", router, {}, d / "router.log", d / "router.pid")
    pidfiles = [d / f"{n}.pid" for n in (*nodes, "router")]
    try:
        for name in nodes:
            subprocess.run(["setsid", "-f", "bash", str(d / f"start-{name}.sh")], check=True)
        for port in nodes.values():
            wait_health(f"http://127.0.0.1:{port}/health", 240)
        subprocess.run(["setsid", "-f", "bash", str(d / "start-router.sh")], check=True)
        wait_health(f"http://127.0.0.1:{pr}/health", 60)
        group = f"$(cat {d}/{{node}}.pid)"
        target = d / "target.toml"
        target.write_text(textwrap.dedent(f"""\
            name = "plain-stack"
            model = "ordeal-tiny"
            entrypoint = "http://127.0.0.1:{pr}"
            api_key_env = "ORDEAL_TEST_API_KEY"
            headers = {{ "x-tenant" = "ordeal-test" }}
            ready_timeout_s = 300
            # A Toxiproxy server counts nothing a toxic did: the team vouches
            # for its latency toxic (fault_effective lists those windows).
            trusted_without_evidence = ["network_latency"]

            [[replica]]
            name = "replica-0"
            url = "http://127.0.0.1:{p0}"

            [[replica]]
            name = "replica-1"
            url = "http://127.0.0.1:{p1}"

            [toxiproxy]
            url = "http://127.0.0.1:{toxiproxy.control.port}"
            links = {{ "router-replica-0" = "vllm-0", "router-replica-1" = "vllm-1" }}

            [[hook]]
            kind = "process_kill"
            node = "*"
            inject = "kill -KILL -- -{group}"
            heal = "setsid bash {d}/start-{{node}}.sh &"
            timeout_s = 30

            [[hook]]
            kind = "process_pause"
            node = "*"
            inject = "kill -STOP -- -{group}"
            heal = "kill -CONT -- -{group}"
            timeout_s = 10
            """))
        yield d, target
    finally:
        for pidfile in pidfiles:
            end_group(pidfile)
        toxiproxy.stop()


@pytest.mark.cluster
@pytest.mark.long(slot=2, covered_by="the hook tests here and in "
                  "tests/test_hook_processes.py, on real bash and a real server process")
@pytest.mark.timeout(900)
def test_the_smoke_suites_run_on_a_deployment_ordeal_did_not_start(plain_stack, ordeal_say):
    d, target = plain_stack
    runs = d / "runs"
    env = {**os.environ, "ORDEAL_TEST_API_KEY": SECRET, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_smoke.py", "suites/test_nemesis.py",
         "-m", "smoke", "--cluster", "external", "--target", str(target),
         "--load-rate", "3", "--load-duration", "20s", "--runs-dir", str(runs),
         "-p", "no:cacheprovider", "-q", "-rs"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    ordeal_say("external smoke: " + proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # What will not run is said at the start: no hook for partition here.
    assert "fault kind network_partition will not run here" in proc.stdout, proc.stdout[-3000:]

    summaries = [json.loads(p.read_text()) for p in runs.glob("*/summary.json")
                 if not p.parent.is_symlink()]  # not "latest"
    assert len(summaries) == 2, [s["suite"] for s in summaries]
    by_suite = {s["suite"]: s for s in summaries}
    smoke = by_suite["test_kill_and_restart_one_replica_under_load"]
    nemesis = by_suite["test_seeded_schedule_of_tolerable_faults"]
    for s in summaries:
        assert s["cluster"]["backend"] == "external"
        assert s["cluster"]["target"]["api_key_env"] == "ORDEAL_TEST_API_KEY"
        invariants = {i["name"]: i for i in s["invariants"]}
        # Judged from the client and /metrics as on an embedded cluster ...
        for name in ("no_silent_loss", "stream_wellformed", "usage_matches_tokens",
                     "slo_latency", "counters_monotonic"):
            assert invariants[name]["valid"] is True, invariants[name]
        # ... and unknown, with the reason, where only Ordeal's nodes have the data.
        for name, need in (("no_duplicate_execution", "served_journal"),
                           ("leak_bound", "process_tree"), ("failover", "node_attribution")):
            assert invariants[name]["valid"] == "unknown", invariants[name]
            assert need in invariants[name]["details"]["not_judgeable"], invariants[name]
            # ... which the verdict leaves out, naming it in its scope (issue 47).
            assert need in s["scope"]["not_judged"][name]["why"], s["scope"]
        assert s["verdict"] == "pass" and not s["scope"]["complete"], s["scope"]
    [kill] = smoke["faults"]
    # The heal hook returned at once (``setsid ... &``): the replica it started
    # outlived it, and Ordeal ended nothing of it (issue 47).
    assert kill["heal_result"]["heal_hook"]["command"].startswith("setsid "), kill
    assert kill["heal_result"]["heal_hook"]["ended"] == [], kill
    assert kill["heal_result"]["restarted"] is True
    kinds = {w["kind"] for w in nemesis["faults"]}
    assert kinds == {"process_pause", "network_latency"}, nemesis["faults"]
    assert nemesis["skipped_kinds"].keys() == {"network_partition"}
    for w in nemesis["faults"]:
        if w["kind"] == "network_latency":
            # On the user's Toxiproxy (router-replica-0), which counts nothing:
            # not observable; its effect is measured in the next test.
            assert w["target"] == "router-replica-0", w
            assert w["inject_result"]["toxics"][0]["latency_ms"] == 150, w
            assert "effect" not in w["heal_result"], w
        else:
            assert w["heal_result"]["effect"]["effective"] is True, w
    # ... so the window is trusted, as the target file says, and listed as such.
    [effective] = [i for i in nemesis["invariants"] if i["name"] == "fault_effective"]
    assert effective["valid"] is True, effective
    assert [x.startswith("network_latency@router-replica-0#")
            for x in effective["details"]["trusted_without_evidence"]] == [True], effective

    # The API key reached no file the runs or their cluster logs wrote.
    written = [p for root in (runs, runs.parent / "clusters") if root.exists()
               for p in root.rglob("*") if p.is_file()]
    assert len(written) > 10, written
    leaked = [str(p) for p in written if SECRET.encode() in p.read_bytes()]
    assert leaked == []

    # A CI that needs failover judged says so, and these replicas name no one.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_nemesis.py", "-m", "smoke", "--cluster",
         "external", "--target", str(target), "--require-judged", "failover",
         "--load-rate", "3", "--load-duration", "15s", "--runs-dir", str(d / "required"),
         "-p", "no:cacheprovider", "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "invariant failover will not be judged here" in proc.stdout, proc.stdout[-3000:]
    assert "failover: not judged on this cluster, and --require-judged names it" in (
        proc.stdout), proc.stdout[-3000:]
    [required] = [json.loads(p.read_text()) for p in (d / "required").glob("*/summary.json")
                  if not p.parent.is_symlink()]
    assert required["verdict"] == "unknown", required["scope"]
    assert required["scope"]["not_judged"]["failover"]["required"] is True


def round_trip_s(url: str) -> float:
    t0 = time.monotonic()
    assert http_get(url, timeout=30.0)[0] == 200
    return time.monotonic() - t0


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_latency_acts_through_the_user_s_toxiproxy_and_heals(plain_stack):
    """network_latency on router-replica-0 goes through the Toxiproxy
    server's API; a replica's /health through that proxy is slower by the
    toxic while it is in and as fast as before once it is healed."""
    _, target = plain_stack
    links = {x.name: x for x in toxiproxy_links(read_target_file(target).toxiproxy)}
    link = links["router-replica-0"]
    assert link.api == "toxiproxy" and link.proxy == "vllm-0"
    url = f"{link.listen.url}/health"
    before = min(round_trip_s(url) for _ in range(5))
    fault = NetworkLatency(link, "run-x", Ledger(), latency_ms=400)
    fault.inject()
    try:
        during = min(round_trip_s(url) for _ in range(3))
    finally:
        healed = fault.heal()
    after = min(round_trip_s(url) for _ in range(5))
    assert during - before > 0.2, (before, during)  # half the toxic's 400 ms, at least
    assert after - before < (during - before) / 2, (before, during, after)
    assert healed["removed"] == 1 and healed["already_gone"] == 0, healed


# -- the hook machinery, on marker files ------------------------------------------


def idle_node() -> ExternalNode:
    [port] = free_ports(1, "127.0.0.1")
    return ExternalNode("replica-0", "replica", Endpoint("127.0.0.1", port))


def test_a_failing_hook_is_a_clear_error_and_the_inject_is_healed(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    healed = tmp_path / "healed"
    hook = Hook("process_kill", "*", "echo about to fail; exit 3", f"touch {healed}", 5.0)
    fault = HookFault(idle_node(), "run-x", ledger, hook)
    with pytest.raises(FaultError, match=r"inject hook: the hook exited 3.*about to fail"):
        fault.inject()
    assert healed.exists()  # the half-done inject was healed by its heal hook
    assert ledger.pending() == []


def test_a_hanging_hook_is_ended_at_its_timeout(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    child = tmp_path / "child.pid"
    hook = Hook("process_pause", "*", f"sleep 300 & echo $! > {child}; wait", "true", 1.0)
    t0 = time.monotonic()
    with pytest.raises(FaultError, match="did not finish within its timeout_s 1"):
        HookFault(idle_node(), "run-x", ledger, hook).inject()
    assert time.monotonic() - t0 < 60  # not the sleep's 300 s
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(
        f"/proc/{pid}").exists() else "gone"
    assert state in ("gone", "Z"), state  # the hook's whole session was ended


def test_garbage_output_is_recorded_not_fatal_and_the_key_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDEAL_TEST_API_KEY", SECRET)
    ledger = Ledger(tmp_path / "ledger")
    hook = Hook("process_pause", "*",
                "head -c 64 /dev/urandom; printf '\\377\\376'; echo key=$ORDEAL_TEST_API_KEY",
                "true", 5.0)
    # A hook sees only the variables its target file names (hook_env).
    fault = HookFault(idle_node(), "run-x", ledger, hook, secret_envs=("ORDEAL_TEST_API_KEY",),
                      hook_env=("ORDEAL_TEST_API_KEY",))
    done = fault.inject()
    out = done["inject_hook"]["output"]
    assert "key=<redacted>" in out and SECRET not in out, out
    assert "\ufffd" in out  # undecodable bytes replaced, kept
    entry = json.loads(ledger.path(fault.entry.id).read_text())
    assert SECRET not in json.dumps(entry)
    healed = fault.heal()
    assert healed["heal_hook"]["exit_code"] == 0
    # A paused node answers nothing: the idle port refuses instead, so the
    # observation says the fault showed no effect.
    assert healed["effect"]["effective"] is False, healed["effect"]


def test_heal_all_runs_the_heal_hook_after_a_sigkilled_harness(tmp_path):
    ledger_dir = tmp_path / "ledger"
    broken, healed = tmp_path / "broken", tmp_path / "healed"
    harness = textwrap.dedent(f"""
        import os, signal
        from faults.hook import HookFault
        from faults.ledger import Ledger
        from nodes.external import ExternalNode
        from ordeal.target import Hook
        from ordeal.topology import Endpoint
        hook = Hook("process_pause", "*", "touch {broken}", "rm -f {broken}; touch {healed}", 5.0)
        node = ExternalNode("replica-0", "replica", Endpoint("127.0.0.1", 9))
        HookFault(node, "run-crashed", Ledger({str(ledger_dir)!r}), hook).inject()
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc = subprocess.run([sys.executable, "-c", harness], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL
    assert broken.exists() and not healed.exists()
    lines = heal_all(Ledger(ledger_dir))
    assert any("ran its heal hook" in line for line in lines), lines
    assert healed.exists() and not broken.exists()
    assert Ledger(ledger_dir).pending() == []


# -- the target file ----------------------------------------------------------------


@pytest.mark.parametrize("text, error", [
    ('model = "m"', "entrypoint: missing"),
    ('entrypoint = "ftp://x:1"\nmodel = "m"', "not an http\\(s\\) URL"),
    ('entrypoint = "http://10.0.0.1:80/v1"\nmodel = "m"', "scheme, host and port only"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\nheaders = { Authorization = "x" }',
     "no Authorization header"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\napi_key_env = "sk-123"',
     "NAME of an environment variable"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n[[hook]]\nkind = "network_latency"\n'
     'node = "*"\ninject = "x"\nheal = "y"', "link faults act through the fault proxy"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n[[hook]]\nkind = "process_kill"\n'
     'node = "replica-9"\ninject = "x"\nheal = "y"', "name a \\[\\[replica\\]\\]"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\ncolour = "red"', "unknown key"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n[toxiproxy]\nurl = "http://10.0.0.2:8474"'
     '\nlinks = { "router-replica-0" = "p" }', "name client-router or router-"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n[toxiproxy]\nurl = "http://10.0.0.2:8474"'
     '\nlinks = { "client-router" = "p" }', "set fault_proxy = false"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\nreplica_header = "x-served-by"',
     "name the replicas"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\nreplica_header = "x served: by"',
     "the name of the response header"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\nreplica_header = "x-served-by"\n'
     '[[replica]]\nname = "a"\nurl = "http://10.0.0.2:80"\nserved_as = ["b"]\n'
     '[[replica]]\nname = "b"\nurl = "http://10.0.0.3:80"', "names both a and b"),
    ('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n[[replica]]\nname = "a"\n'
     'url = "http://10.0.0.2:80"\nserved_as = [1]', "served_as: give the replica_header"),
])
def test_a_bad_target_file_says_what_is_wrong(tmp_path, text, error):
    path = tmp_path / "target.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        read_target_file(path)


def test_a_replica_header_value_is_placed_on_the_replica_that_claims_it(tmp_path):
    """By name, by the URL's host:port, by a served_as value; a value no
    replica claims places nothing (never a guess); without the key, Ordeal's
    own x-ordeal-node as it is."""
    path = tmp_path / "target.toml"
    path.write_text('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n'
                    'replica_header = "X-Served-By"\n'
                    '[[replica]]\nname = "pod-a"\nurl = "http://10.0.0.2:8000"\n'
                    '[[replica]]\nname = "pod-b"\nurl = "http://10.0.0.3:8000"\n'
                    'served_as = ["vllm-1", "10.9.9.9:8000"]\n')
    t = read_target_file(path)
    assert t.replica_header == "x-served-by" and t.describe()["replica_header"] == "x-served-by"
    options = ClientOptions(node_header=t.replica_header, node_names=t.node_names())
    for value, name in (("pod-a", "pod-a"), ("10.0.0.2:8000", "pod-a"), ("vllm-1", "pod-b"),
                        ("10.9.9.9:8000", "pod-b"), ("10.0.0.4:8000", None)):
        assert options.node_of(CIMultiDict({"X-Served-By": value})) == name, value
    assert options.node_of(CIMultiDict({"x-ordeal-node": "replica-0"})) is None
    assert ClientOptions().node_of(CIMultiDict({"x-ordeal-node": "replica-0"})) == "replica-0"


def test_a_non_loopback_target_is_refused_without_allow_target(tmp_path):
    path = tmp_path / "target.toml"
    path.write_text('entrypoint = "http://10.0.0.1:80"\nmodel = "m"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_smoke.py", "-m", "smoke", "--cluster",
         "external", "--target", str(path), "--runs-dir", str(tmp_path / "runs"),
         "-p", "no:cacheprovider", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "refusing to touch 10.0.0.1:80" in out and "--allow-target" in out, out[-3000:]


def test_the_catalogue_says_how_each_kind_acts_on_a_target(tmp_path):
    path = tmp_path / "target.toml"
    path.write_text(textwrap.dedent("""\
        entrypoint = "http://127.0.0.1:8000"
        model = "m"
        fault_proxy = false
        [[replica]]
        name = "replica-0"
        url = "http://127.0.0.1:8001"
        [toxiproxy]
        url = "http://127.0.0.1:8474"
        links = { "router-replica-0" = "vllm-0" }
        [[hook]]
        kind = "process_kill"
        node = "*"
        inject = "true"
        heal = "true"
        """))
    proc = subprocess.run([sys.executable, "-m", "faults", "catalogue", "--target", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "acts through the hooks for *" in lines["process_kill"]
    assert "Toxiproxy links ['router-replica-0']" in lines["network_latency"]
    assert "refused: acts on HTTP and SSE (L7)" in lines["http_fault"]
    assert 'give a [[hook]] with kind = "process_pause"' in lines["process_pause"]
    from faults.catalogue import common_kinds
    # 3 L4 link kinds and the kill, of every kind the catalogue has
    assert f"4 of {len(common_kinds())} kinds can act" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "faults", "catalogue", "--target",
                          str(tmp_path / "missing.toml")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_a_hook_that_leaves_a_child_returns_when_bash_does(tmp_path):
    child = tmp_path / "child.pid"
    hook = Hook("process_pause", "*", f"sleep 300 & echo $! > {child}; echo started", "true",
                30.0)
    fault = HookFault(idle_node(), "run-x", Ledger(tmp_path / "ledger"), hook)
    done = fault.inject()  # with a pipe, the sleep would hold it open until the timeout
    assert done["inject_hook"]["exit_code"] == 0 and "started" in done["inject_hook"]["output"]
    assert done["inject_hook"]["seconds"] < 30
    pid = int(child.read_text())
    try:
        # A background job of the hook is the user's (issue 47): left running.
        assert Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        assert done["inject_hook"]["ended"] == [], done
    finally:
        os.kill(pid, signal.SIGKILL)
        fault.heal()


def test_the_api_key_is_scrubbed_from_what_the_server_says_back():
    out = scrubbed(Outcome("fail", {"status": 401, "body": f"bad key {SECRET}"},
                           f"HTTP 401: bad key {SECRET}"), SECRET)
    assert SECRET not in json.dumps(out.value) and SECRET not in out.error
    assert "<redacted>" in out.error and out.value["status"] == 401


def test_l7_kinds_are_refused_on_a_tls_entrypoint(tmp_path):
    path = tmp_path / "target.toml"
    path.write_text('entrypoint = "https://127.0.0.1:8443"\nmodel = "m"\n')
    target = read_target_file(path)
    assert "encrypted bytes" in target.unsupported("http_fault")
    assert "encrypted bytes" in target.unsupported("lsn_jump")
    assert target.unsupported("network_latency") is None  # L4 acts on any bytes


# -- a deployment that names its replicas in a header of its own (issue 47) -------


@pytest.mark.cluster
@pytest.mark.timeout(400)
@pytest.mark.long(slot=0, covered_by="named victims and --require-judged on planted histories "
                  "(tests/test_failover.py, test_fault_slo.py, test_verdict_honest.py); "
                  "the external smoke (slot 2)")
def test_a_replica_header_lets_failover_be_judged_and_required(ordeal_cluster, tmp_path,
                                                                ordeal_say, installed_ordeal):
    """The session's cluster, reached as an external target whose file
    calls its replicas ``pod-a``/``pod-b`` and names them by the header they
    answer with (``x-ordeal-node: replica-N``, claimed with ``served_as``).
    The nemesis smoke pauses them through the hooks and passes with
    ``--require-judged failover,fault_slo``: both judged on the header, and
    saying so; only what has no header (served journals, process trees) is
    left out, in the scope. It runs as a team runs it: ``ordeal smoke`` of
    the wheel installed with its light core (tests/test_install.py), from a
    directory of the team's, outside the checkout."""
    replicas = ordeal_cluster.replicas()
    pods = [f"pod-{letter}" for letter in "ab"]
    target = tmp_path / "named.toml"
    target.write_text(textwrap.dedent(f"""\
        name = "named-replicas"
        model = "ordeal-tiny"
        entrypoint = "{ordeal_cluster.router.endpoint.url}"
        fault_proxy = false
        replica_header = "X-Ordeal-Node"
        """) + "".join(textwrap.dedent(f"""
        [[replica]]
        name = "{pods[i]}"
        url = "{r.endpoint.url}"
        served_as = ["{r.name}"]
        """) for i, r in enumerate(replicas)) + "".join(textwrap.dedent(f"""
        [[hook]]
        kind = "process_pause"
        node = "{pods[i]}"
        inject = "kill -STOP -- -{r.process.pid}"
        heal = "kill -CONT -- -{r.process.pid}"
        timeout_s = 10
        """) for i, r in enumerate(replicas)))
    assert read_target_file(target).node_names()[0] == ("pod-a", "pod-a")
    # The stack is the embedded one, so its known slow ejection (~6 s) is the
    # team's known finding too, on the names its file gives (--known-findings
    # "auto" applies the shipped file only to Ordeal's own cluster).
    known = tmp_path / "known.toml"
    shipped = embedded_file([n.fingerprint() for n in ordeal_cluster.nodes])
    assert shipped is not None, [n.fingerprint() for n in ordeal_cluster.nodes]
    known.write_text(shipped.read_text()
                     .replace('"*replica-*"', '"*pod-*"').replace('"replica-*"', '"pod-*"'))
    team = tmp_path / "team"
    team.mkdir()
    proc = installed_ordeal.run(
        ["ordeal", "smoke", "-k", "seeded_schedule",
         "--cluster", "external", "--target", str(target), "--require-judged",
         "failover,fault_slo", "--known-findings", str(known),
         "--load-rate", "3", "--load-duration", "20s", "-p", "no:cacheprovider", "-q"],
        team, timeout=360)
    ordeal_say("external nemesis, replica_header, installed `ordeal smoke`: "
               + proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.match(r"1 passed, \d+ deselected in", proc.stdout.splitlines()[-1]), (
        proc.stdout[-1500:])  # no warning either
    runs = team / "reports" / "runs"  # the default: under the directory it ran from
    assert not list(installed_ordeal.venv.glob("lib/python3*/site-packages/suites/reports"))
    [summary] = [json.loads(p.read_text()) for p in runs.glob("*/summary.json")
                 if not p.parent.is_symlink()]
    assert summary["verdict"] == "pass"
    invariants = {i["name"]: i for i in summary["invariants"]}
    windows = invariants["failover"]["details"]["windows_shown"]
    assert windows and {w["replica"] for w in windows.values()} <= {"pod-a", "pod-b"}, windows
    for name in ("failover", "fault_slo"):
        # Judged: held, or a failure inside the known finding's bounds.
        assert invariants[name]["valid"] is True or invariants[name].get("known"), (
            invariants[name])
        assert "X-Ordeal-Node".lower() in invariants[name]["details"]["judged_with"][
            "node_attribution"], invariants[name]
    scope = summary["scope"]
    assert scope["require_judged"] == ["failover", "fault_slo"]
    assert {"failover", "fault_slo"} <= set(scope["judged"])
    assert {"no_duplicate_execution", "leak_bound"} <= scope["not_judged"].keys(), scope
