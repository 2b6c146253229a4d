"""fault_effective: a fault that did nothing makes the run unknown, with the
reason. Histories are planted op by op with the shapes the nemesis records
(the heal/end op carries the fault's observation, ``effect``); the real
observations of each kind are tested where the kind is (test_kernel_faults,
test_link_faults, test_process_faults, test_gpu_faults) and a whole run with
a fault that does nothing in test_fault_effective_run."""

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faults import clock_drift
from faults.clock_drift import ClockDrift, probe_clock
from faults.ledger import Ledger
from invariants import DEFAULT_CHECKERS, FaultEffective, RunContext
from invariants.fault_effective import clock_threshold_s
from invariants.settings import CheckerSettings
from nodes.ports import free_ports
from ordeal.config import ConfigError
from ordeal.faketime import prepare_clock_file
from ordeal.history.ops import MONITOR, NEMESIS, Op
from ordeal.target import read_target_file, trustable_kinds
from ordeal.topology import Endpoint
from reports.summary import verdict_of

CTX = RunContext(run_id="t")
T0 = datetime(2026, 12, 2, tzinfo=timezone.utc)


def wall(t: float) -> str:
    return (T0 + timedelta(seconds=t)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Plan:
    def __init__(self):
        self.ops: list[Op] = []
        self.proc = 0

    def _op(self, t, type, process, f, value, error=None):
        self.ops.append(Op(len(self.ops), int(t * 1e9), wall(t), type, process, f, value, error))

    def fault(self, at, healed, kind="network_partition", target="replica-1", effect=None,
              inject_error=None, inject_value=None):
        v = {"kind": kind, "target": target}
        self._op(at, "info", NEMESIS, "inject", {**v, "phase": "begin"})
        self._op(at + 0.01, "info", NEMESIS, "inject",
                 {**v, **(inject_value or {}), "phase": "end"}, inject_error)
        self._op(healed, "info", NEMESIS, "heal", {**v, "phase": "begin"})
        end = {**v, "phase": "end"}
        if effect is not None:
            end["effect"] = effect
        self._op(healed + 0.01, "info", NEMESIS, "heal", end)

    def answer(self, at, done, node, created=None):
        self.proc += 1
        self._op(at, "invoke", self.proc, "completions", {"seq": self.proc})
        value = {"seq": self.proc, "node": node}
        if created is not None:
            value["created"] = created
        self._op(done, "ok", self.proc, "completions", value)

    def judge(self, ctx=CTX):
        return FaultEffective().check(sorted(self.ops, key=lambda o: o.time_ns), ctx)


def seen(effective, **evidence):
    return {"effective": effective, "how": "planted", "evidence": evidence}


def epoch(t: float) -> int:
    return int((T0 + timedelta(seconds=t)).timestamp())


def test_faults_that_acted_are_valid_with_counts_per_kind():
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, kind="process_kill", effect=seen(True, port="refused"))
    r = p.judge()
    assert r.valid is True, r.details
    assert r.details["windows"] == 2 and r.details["effective"] == 2
    assert r.details["by_kind"]["process_kill"]["effective"] == 1


def test_a_partition_that_matched_no_packet_makes_the_run_unknown_with_the_reason():
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, target="nobody", effect=seen(False, packets_matched=0))
    r = p.judge()
    assert r.valid == "unknown"
    assert r.details["no_effect"] == 1 and r.details["effective"] == 1
    assert "showed no effect" in r.details["why"]
    [ex] = r.counterexamples
    assert ex["target"] == "nobody" and ex["evidence"] == {"packets_matched": 0}
    assert "network_partition on nobody showed no effect" in ex["problem"]
    assert verdict_of([True, r.valid]) == "unknown"


def test_an_observation_that_failed_is_unknown_not_a_pass():
    p = Plan()
    p.fault(1, 5, effect={"effective": None, "how": "the observation failed",
                          "error": "ProxyUnreachable: refused"})
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    assert "ProxyUnreachable" in r.counterexamples[0]["problem"]


def test_windows_that_cannot_be_judged_are_counted_not_passed_silently():
    p = Plan()
    p.fault(1, 3, kind="ray_node_loss")  # no observation recorded: no evidence, unknown
    p.fault(4, 5, inject_error="FaultError: no such node")  # never went in: not a window here
    p._op(6, "info", NEMESIS, "inject", {"kind": "process_pause", "target": "replica-0",
                                         "phase": "begin"})
    p._op(6.1, "info", NEMESIS, "inject", {"kind": "process_pause", "target": "replica-0",
                                           "phase": "end"})
    p._op(7, "info", MONITOR, "gap", {})  # the harness died in the window
    r = p.judge()
    assert r.valid == "unknown"
    assert r.details["windows"] == 2
    assert r.details["not_observable"] == 1 and r.details["not_judged"] == 1
    assert r.details["no_evidence"] == ["ray_node_loss@replica-1#1"]


def test_clock_drift_is_judged_from_the_answers_created_stamps():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 3600,
                                                     "takes_effect_within_s": 2})
    p.answer(1.5, 1.6, "replica-1", created=epoch(1.5))  # before it took effect: not counted
    p.answer(4, 4.2, "replica-1", created=epoch(4) + 3600)
    p.answer(5, 5.2, "replica-0", created=epoch(5))  # another node
    r = p.judge()
    assert r.valid is True and r.details["effective"] == 1, r.counterexamples


def test_a_clock_that_did_not_move_is_caught():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 3600,
                                                     "takes_effect_within_s": 2})
    for t in (4, 5, 6):
        p.answer(t, t + 0.1, "replica-1", created=epoch(t))
    p.answer(10.5, 10.6, "replica-1", created=epoch(10.5) + 3600)  # after the heal began
    r = p.judge()
    assert r.valid == "unknown" and r.details["no_effect"] == 1
    assert r.counterexamples[0]["evidence"]["answers"] == 3


def test_a_clock_fault_whose_target_answered_nothing_is_unobserved():
    p = Plan()
    p.fault(1, 10, kind="clock_drift", inject_value={"offset_s": 60})
    p.answer(4, 4.1, "replica-0", created=epoch(4))
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    assert "no answer of replica-1" in r.counterexamples[0]["problem"]


def test_the_clock_threshold_follows_the_offset_within_the_stamps_resolution():
    assert clock_threshold_s(3600) == 2.0
    assert clock_threshold_s(3) == 1.5
    assert clock_threshold_s(0.5) == 1.0
    assert clock_threshold_s(None) == 2.0


def test_a_run_without_faults_has_nothing_to_prove_and_it_is_a_default_checker():
    assert FaultEffective in DEFAULT_CHECKERS
    p = Plan()
    p.answer(1, 1.1, "replica-0")
    r = p.judge()
    assert r.valid is True and r.details["windows"] == 0


def test_memory_is_bounded_by_what_is_open_not_run_length():
    p = Plan()
    for i in range(300):
        t = 10 * i
        p.fault(t + 1, t + 5, effect=seen(i % 2 == 0, packets_matched=i % 2 * 7))
        p.fault(t + 2, t + 6, kind="clock_drift", inject_value={"offset_s": 3600})
        p.answer(t + 4.5, t + 4.6, "replica-1", created=epoch(t + 4.5) + 3600)
    checker = FaultEffective()
    r = checker.check(sorted(p.ops, key=lambda o: o.time_ns), CTX)
    assert not checker.clocks and not checker.invoked and len(checker.examples) <= 5
    assert r.details["windows"] == 600 and r.details["no_effect"] == 150
    assert r.details["by_kind"]["clock_drift"]["effective"] == 300


# -- windows without evidence (issue 39, item 3) ------------------------------------


def test_a_window_without_evidence_is_unknown_with_its_label_not_a_pass():
    """A Toxiproxy link's toxic (the server counts nothing) or a hook kind
    with no observation records no ``effect``: it proves nothing."""
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, kind="network_latency", target="router-replica-0")  # no observation
    r = p.judge()
    assert r.valid == "unknown", r.details
    assert r.details["not_observable"] == 1 and r.details["effective"] == 1
    assert r.details["no_evidence"] == ["network_latency@router-replica-0#1"]
    assert "left no evidence" in r.details["why"]
    assert "network_latency@router-replica-0#1" in r.details["why"]
    [ex] = r.counterexamples
    assert "trusted_without_evidence" in ex["problem"] and ex["kind"] == "network_latency"
    assert verdict_of([True, r.valid]) == "unknown"


def test_a_kind_trusted_without_evidence_counts_and_its_windows_are_listed():
    ctx = RunContext(run_id="t", settings=CheckerSettings(
        trusted_without_evidence=("network_latency",)))
    p = Plan()
    p.fault(1, 5, effect=seen(True, packets_matched=120))
    p.fault(6, 9, kind="network_latency", target="router-replica-0")
    p.fault(10, 12, kind="network_latency", target="router-replica-0")
    r = p.judge(ctx)
    assert r.valid is True, r.details
    assert r.details["trusted"] == 2 and r.details["not_observable"] == 0
    assert r.details["trusted_without_evidence"] == ["network_latency@router-replica-0#1",
                                                     "network_latency@router-replica-0#2"]
    assert "on the user's word" in r.details["note"]
    assert "no_evidence" not in r.details
    # Trust covers its kind only, and only a window without evidence.
    p.fault(13, 15, kind="http_fault", target="router-replica-0")
    p.fault(16, 18, kind="network_latency", target="router-replica-1",
            effect=seen(False, toxic_hits={}))
    r = p.judge(ctx)
    assert r.valid == "unknown"
    assert r.details["no_evidence"] == ["http_fault@router-replica-0#1"]
    assert r.details["no_effect"] == 1 and r.details["trusted"] == 2


def test_a_hook_s_clock_drift_without_evidence_is_unknown_unless_trusted():
    p = Plan()
    v = {"kind": "clock_drift", "target": "replica-0"}
    p._op(1, "info", NEMESIS, "inject", {**v, "phase": "begin"})
    p._op(1.1, "info", NEMESIS, "inject", {**v, "phase": "end", "via": "hook"})
    p._op(5, "info", NEMESIS, "heal", {**v, "phase": "begin"})
    p._op(5.1, "info", NEMESIS, "heal", {**v, "phase": "end", "heal_hook": {"exit_code": 0}})
    assert p.judge().valid == "unknown"
    trusted = RunContext(settings=CheckerSettings(trusted_without_evidence=("clock_drift",)))
    r = p.judge(trusted)
    assert r.valid is True and r.details["trusted_without_evidence"] == ["clock_drift@replica-0#1"]


def test_the_trusted_kinds_come_from_the_target_file_checked(tmp_path):
    base = 'entrypoint = "http://127.0.0.1:8000"\nmodel = "m"\n'
    path = tmp_path / "target.toml"
    path.write_text(base + 'trusted_without_evidence = ["http_fault", "process_kill"]\n')
    target = read_target_file(path)
    assert target.trusted_without_evidence == ("http_fault", "process_kill")
    assert target.describe()["trusted_without_evidence"] == ["http_fault", "process_kill"]
    assert "process_kill" in trustable_kinds() and "ray_node_loss" not in trustable_kinds()
    path.write_text(base)
    assert read_target_file(path).trusted_without_evidence == ()
    for value, error in (('["http_fualt"]', r"unknown fault kind\(s\) \['http_fualt'\].*"
                                            "network_latency"),
                         ('"http_fault"', "give a list of fault kinds")):
        path.write_text(base + f"trusted_without_evidence = {value}\n")
        with pytest.raises(ConfigError, match=f"trusted_without_evidence: {error}"):
            read_target_file(path)


def test_the_trusted_kinds_reach_the_checker_settings_and_survive_a_schedule_file():
    s = CheckerSettings(trusted_without_evidence=("http_fault",))
    doc = json.loads(json.dumps(s.overrides()))
    assert doc == {"trusted_without_evidence": ["http_fault"]}
    assert CheckerSettings.from_overrides(doc, "here") == s
    with pytest.raises(ConfigError, match="expected a list of strings"):
        CheckerSettings.from_overrides({"trusted_without_evidence": "http_fault"}, "here")


def test_the_plugin_gives_the_target_file_s_trusted_kinds_to_the_checkers(tmp_path):
    """--cluster external --target FILE: ordeal_config's checker settings
    carry the file's trusted kinds (what OrdealRun, endurance and the
    single-fault runs hand to every checker's RunContext)."""
    import subprocess
    import sys
    repo = Path(__file__).resolve().parent.parent
    target = tmp_path / "target.toml"
    target.write_text('entrypoint = "http://127.0.0.1:9"\nmodel = "m"\n'
                      'trusted_without_evidence = ["http_fault"]\n')
    probe = tmp_path / "test_probe_settings.py"
    probe.write_text("def test_settings(ordeal_config):\n"
                     "    print('TRUSTED', ordeal_config.checker_settings"
                     ".trusted_without_evidence)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(probe), "-p", "fixtures.plugin", "-s", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--cluster", "external",
         "--target", str(target), "--runs-dir", str(tmp_path / "runs")],
        cwd=repo, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "TRUSTED ('http_fault',)" in out, out[-3000:]


# -- clock_drift's active probe ------------------------------------------------------


def test_a_clock_window_no_answer_reached_is_judged_from_the_probe():
    """The compressed endurance run's 2 s clock_drift window that no request
    reached: the fault's probe of the node's clock is the evidence."""
    def probed(skew, **extra):
        return {"effective": None, "how": "probe",
                "evidence": {"probe": {"skew_s": skew, "source": "created", **extra}}}
    p = Plan()
    p.fault(1, 3, kind="clock_drift", inject_value={"offset_s": 3600}, effect=probed(3600.4))
    p.answer(1.5, 1.6, "replica-0", created=epoch(1.5))  # another node's answer
    r = p.judge()
    assert r.valid is True and r.details["effective"] == 1, r.counterexamples
    p = Plan()
    p.fault(1, 3, kind="clock_drift", inject_value={"offset_s": 3600}, effect=probed(0.3))
    r = p.judge()
    assert r.valid == "unknown" and r.details["no_effect"] == 1
    assert r.counterexamples[0]["evidence"]["probe_skew_s"] == 0.3
    assert "read by a probe was +0.3 s off" in r.counterexamples[0]["problem"]
    p = Plan()  # a strobed clock read in its real-time half proves nothing either way
    p.fault(1, 3, kind="clock_drift", inject_value={"offset_s": 60},
            effect=probed(0.1, inconclusive="a strobed clock spends half its time at real"))
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    p = Plan()
    p.fault(1, 3, kind="clock_drift", inject_value={"offset_s": 60},
            effect={"effective": None, "how": "probe", "evidence": {"probe": {
                "error": "URLError: refused"}}})
    r = p.judge()
    assert r.valid == "unknown" and "URLError: refused" in r.counterexamples[0]["problem"]


class ClockServer:
    """A stub of a replica's API server: GET /v1/models answers with a
    ``created`` stamp of its own clock, which is the harness's moved by the
    offset in ``clock_file`` (as libfaketime moves a node's), ``delay_s``
    after the file was written (libfaketime re-reads it each second);
    ``date_only``: a 401 carrying that clock in its Date header only;
    ``hang``: never answers."""

    def __init__(self, clock_file: Path, date_only: bool = False, hang: bool = False,
                 delay_s: float = 0.0):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def date_time_string(self, timestamp=None):
                return formatdate(server.now(), usegmt=True)

            def do_GET(self):
                if hang:
                    time.sleep(5)
                    return
                if date_only:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"object": "list", "data": [
                    {"id": "m", "object": "model", "created": int(server.now())}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.clock_file, self.delay_s = clock_file, delay_s
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.endpoint = Endpoint("127.0.0.1", self.http.server_address[1])

    def now(self) -> float:
        offset = 0.0
        if self.clock_file.exists() and (time.time() - self.clock_file.stat().st_mtime
                                         >= self.delay_s):
            offset = float(self.clock_file.read_text().split()[0])
        return time.time() + offset


class StubNode:
    role = "replica"

    def __init__(self, name, endpoint, clock_file):
        self.name, self.endpoint, self._clock = name, endpoint, clock_file

    def is_running(self):
        return True

    def pids(self):
        return []

    @property
    def clock_file(self):
        return self._clock


@pytest.fixture
def clock_server(tmp_path):
    made = []

    def make(**kw):
        clock = tmp_path / f"replica-{len(made)}.clock"
        prepare_clock_file(clock)
        s = ClockServer(clock, **kw)
        made.append(s)
        return s, StubNode("replica-1", s.endpoint, clock)
    yield make
    for s in made:
        s.http.shutdown()
        s.http.server_close()


def test_clock_drift_observes_the_node_s_own_clock_and_fault_effective_judges_it(
        clock_server, tmp_path):
    """inject, heal: the heal's observation carries the node's clock as it
    reports it, and that alone (no answer of the load reached the node)
    makes the window effective."""
    _, node = clock_server()
    fault = ClockDrift(node, "t-probe", Ledger(tmp_path / "ledger"), mode="offset",
                       offset_s=3600)
    injected = fault.inject()
    healed = fault.heal()
    effect = healed["effect"]
    assert effect["effective"] is True, effect
    probe = effect["evidence"]["probe"]
    assert probe["source"] == "created" and abs(probe["skew_s"] - 3600) <= 1.5, probe
    assert probe["url"] == f"{node.endpoint.url}/v1/models"
    p = Plan()
    p.fault(1, 3, kind="clock_drift", target="replica-1",
            inject_value={k: injected[k] for k in ("offset_s", "takes_effect_within_s")},
            effect=effect)
    r = p.judge()
    assert r.valid is True and r.details["effective"] == 1, (r.details, r.counterexamples)


def test_the_probe_waits_out_the_clock_s_reread_before_it_says_no_move(
        clock_server, tmp_path, monkeypatch):
    monkeypatch.setattr(clock_drift, "EFFECT_DELAY_S", 1.0)
    _, node = clock_server(delay_s=0.4)  # the node sees the new clock 0.4 s after the write
    fault = ClockDrift(node, "t-wait", Ledger(tmp_path / "ledger"), offset_s=-120)
    fault.inject()
    effect = fault.heal()["effect"]
    probe = effect["evidence"]["probe"]
    assert effect["effective"] is True and 0 < probe["waited_s"] <= 1.0, effect
    assert abs(probe["skew_s"] + 120) <= 1.5, probe


def test_a_clock_that_did_not_move_is_no_effect_by_the_probe(clock_server, tmp_path):
    server, node = clock_server()
    server.clock_file = tmp_path / "elsewhere.clock"  # the server reads no file: never moves
    fault = ClockDrift(node, "t-still", Ledger(tmp_path / "ledger"), offset_s=3600)
    fault.inject()
    fault._injected_at = time.monotonic() - 10  # long in: no wait
    effect = fault.heal()["effect"]
    assert effect["effective"] is False and abs(effect["evidence"]["probe"]["skew_s"]) <= 1.5
    assert "waited_s" not in effect["evidence"]["probe"]


def test_the_probe_reads_the_date_header_of_any_answer(clock_server):
    server, _ = clock_server(date_only=True)
    server.clock_file.write_text("+600 x1\n")
    probe = probe_clock(server.endpoint.url)
    assert probe["source"] == "date" and abs(probe["skew_s"] - 600) <= 2.0, probe


def test_a_probe_that_reads_nothing_never_raises_and_is_no_evidence(clock_server, tmp_path):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    assert "refused" in probe_clock(dead)["error"].lower()
    server, _ = clock_server(hang=True)
    t0 = time.monotonic()
    probe = probe_clock(server.endpoint.url, timeout=0.5)
    assert "error" in probe and "skew_s" not in probe and time.monotonic() - t0 < 2.0, probe
    node = StubNode("replica-1", Endpoint("127.0.0.1", int(dead.rsplit(":", 1)[1])),
                    tmp_path / "c.clock")
    fault = ClockDrift(node, "t-dead", Ledger(tmp_path / "ledger"))
    fault._injected_at = time.monotonic() - 10
    effect = fault.observe().to_dict()
    assert effect["effective"] is None and "error" in effect["evidence"]["probe"]
    p = Plan()
    p.fault(1, 3, kind="clock_drift", inject_value={"offset_s": 3600}, effect=effect)
    r = p.judge()
    assert r.valid == "unknown" and r.details["unobserved"] == 1
    assert "its probe:" in r.counterexamples[0]["problem"]
