"""Against the real thing: vLLM replicas behind vllm-router on this machine.

These share one session cluster (the plugin's ``ordeal_cluster``, started
once, ~30-60 s) and one or two extra replicas started on purpose to fail.
"""

import asyncio
import json
import os
import urllib.error
import urllib.request

import pytest

from engines.vllm.model import ensure_tiny_model
from engines.vllm.nodes import SERVED_MODEL_NAME, ReplicaConfig, VllmReplica
from faults import Ledger, ProcessKill
from invariants import NoSilentLoss, RunContext, StreamWellFormed
from load.monitor import node_journal
from load.spec import CANARY_PROMPTS, WorkloadSpec
from load.workload import WorkloadRunner
from nodes.ports import free_ports
from nodes.process import group_members
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from ordeal.journal import JournalTail
from ordeal.topology import Endpoint, NodeNotReady

pytestmark = pytest.mark.cluster


def complete(base_url, prompt, max_tokens=16, timeout=30):
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.headers.get("x-ordeal-node"), json.loads(resp.read())


def test_real_traffic_is_recorded_and_judged_valid(ordeal_cluster, tmp_path):
    h = History(tmp_path / "h.jsonl")
    spec = WorkloadSpec(duration_s=6, rate=6, seed=5)
    tails = {n.name: JournalTail(node_journal(n)) for n in ordeal_cluster.replicas()}
    asyncio.run(WorkloadRunner(spec, ordeal_cluster.entrypoint.url, h).run())
    h.close()
    history = list(read_history(tmp_path / "h.jsonl"))
    # The disk plan's bytes per request (runs/disk_plan.py, no monitor here)
    # against what these real answers wrote.
    from runs.disk_plan import plan_disk
    estimate = plan_disk(spec, nodes=0, run_dir=tmp_path).history_bytes
    actual = (tmp_path / "h.jsonl").stat().st_size
    assert 0.5 < actual / estimate < 2, (actual, estimate)
    # The router forwarded each request id, and each replica's served journal
    # saw exactly the requests the client says it served, once, complete.
    served = {}
    for name, tail in tails.items():
        entries, begun, bad = tail.read_new()
        assert bad == []
        assert sorted(begun) == sorted(e[0] for e in entries)  # each began, each ended
        for rid, status, complete_ in entries:
            assert (status, complete_) == (200, True)
            served.setdefault(rid, []).append(name)
    rids = {o.process: o.value["request_id"] for o in history if o.type == "invoke"}
    client_view = {rids[o.process]: [o.value["node"]] for o in history if o.type == "ok"}
    assert served == client_view
    done = [o for o in history if o.type != "invoke"]
    assert len(done) >= 15 and all(o.type == "ok" for o in done), [o.error for o in done][:3]
    served_by = {o.value["node"] for o in done}
    assert served_by == {n.name for n in ordeal_cluster.replicas()}  # the router spreads load
    for o in done:
        assert o.value["fingerprint"].startswith("vllm-0.32.0"), o.value
        assert o.value["e2e_ms"] > 0 and o.value["output_tokens"] >= 1
        if o.value.get("stream"):
            assert o.value["ttft_ms"] <= o.value["e2e_ms"]
            assert len(o.value["itl_ms"]) == o.value["stream"]["n_chunks"] - 1
            # Every completion chunk carries visible text: the tiny model never
            # emits special or partial-byte tokens (see engines/vllm/model.py).
            # (A chat stream opens with a role-only chunk, which vllm bench
            # serve also counts as the first token.)
            texts = o.value["stream"]["texts"]  # each event's text, one per ITL + 1
            assert len(texts) == o.value["stream"]["n_chunks"], o.value["stream"]
            # vllm-router 0.1.17 drops stream_options.continuous_usage_stats,
            # so through it no chunk carries the running token count.
            assert o.value["stream"]["seq_chunks"] in (0, len(texts)), o.value["stream"]
            if o.f == "completions":
                assert all(texts), texts
            assert any(texts)
    # Straight to a replica, every chunk carries the stream's sequence
    # (continuous usage stats), which is what lets the stream checker see a
    # lost, repeated or swapped event.
    async def direct():
        import aiohttp

        from load.client import send_request
        from load.plan import PlannedRequest
        req = PlannedRequest(0, 0.0, "completions", True, "direct sequence", 12, 0.0, False)
        async with aiohttp.ClientSession() as s:
            return await send_request(s, ordeal_cluster.replicas()[0].endpoint.url, req,
                                      SERVED_MODEL_NAME, 30, True, "direct-seq")
    out = asyncio.run(direct())
    assert out.type == "ok", out
    assert out.value["stream"]["seq_chunks"] == out.value["stream"]["n_chunks"] >= 1, out.value
    assert out.value["stream"]["sequence_problems"] == []
    ctx = RunContext()
    assert NoSilentLoss().check(history, ctx).valid is True
    assert StreamWellFormed().check(history, ctx).valid is True


def test_greedy_output_is_the_same_direct_through_the_router_and_under_load(ordeal_cluster):
    """Measured fact the determinism checker will rely on (DESIGN.md asks to
    measure before choosing a tolerance): on this CPU model greedy output
    does not depend on the replica, the router, or concurrent load."""
    prompt = CANARY_PROMPTS[0]
    texts = {complete(r.endpoint.url, prompt)[1]["choices"][0]["text"]
             for r in ordeal_cluster.replicas()}
    texts.add(complete(ordeal_cluster.entrypoint.url, prompt)[1]["choices"][0]["text"])
    assert len(texts) == 1, texts
    [golden] = texts
    assert len(golden) > 0

    async def many():
        import aiohttp
        async with aiohttp.ClientSession() as s:
            async def one(p):
                body = {"model": SERVED_MODEL_NAME, "prompt": p, "max_tokens": 16,
                        "temperature": 0}
                async with s.post(ordeal_cluster.entrypoint.url + "/v1/completions",
                                  json=body) as r:
                    return (await r.json())["choices"][0]["text"]
            # The canary inside a batch of other prompts.
            others = [f"{w} cluster queue" for w in ("alpha", "beta", "gamma", "delta")] * 3
            return await asyncio.gather(*(one(p) for p in [prompt] * 4 + others))
    under_load = asyncio.run(many())
    assert set(under_load[:4]) == {golden}, under_load[:4]


def test_process_kill_is_seen_and_its_heal_is_seen(ordeal_cluster, tmp_path):
    victim = ordeal_cluster.replicas()[-1]
    assert complete(victim.endpoint.url, "before")[0] == victim.name
    old_pid = victim.pid
    old_group = group_members(old_pid)
    ledger = Ledger(tmp_path / "ledger")
    fault = ProcessKill(victim, "test-run", ledger, restart=True, ready_timeout_s=300)
    injected = fault.inject()
    try:
        # Effect: the whole process tree is gone and the port refuses.
        assert injected["signal"] == "SIGKILL" and injected["pid"] == old_pid
        assert group_members(old_pid) == [] and len(old_group) >= 2
        with pytest.raises(urllib.error.URLError, match="refused"):
            complete(victim.endpoint.url, "during", timeout=5)
        # The ledger knew before the kill, and still knows.
        [entry] = ledger.pending()
        assert entry.kind == "process_kill" and entry.target == victim.name
    finally:
        healed = fault.heal()
    # The heal observed the kill before it restarted the node.
    assert healed["effect"]["effective"] is True, healed["effect"]
    assert healed["effect"]["evidence"]["port"] == "refused"
    # Heal: a new process serves again, and the ledger is empty.
    assert healed["restarted"] is True and victim.pid != old_pid
    # Where the restart's time went, read from the replica's own log: every
    # step of a vLLM start, adding up to the measured total (+-1 s a step).
    phases = healed["restart_phases"]
    assert "missing" not in phases, phases
    assert list(phases["phases"]) == ["api_server_imports", "engine_core_spawn", "worker_spawn",
                                      "weights_load", "engine_init", "api_server_listen",
                                      "health_ok"], phases
    assert abs(sum(phases["phases"].values()) - healed["ready_after_s"]) <= 7, (phases, healed)
    assert complete(victim.endpoint.url, "after")[0] == victim.name
    # Each replica's whole process tree, the restarted one's too, runs on
    # its own core only (--replica-cpus own, engines/vllm/cpus.py), as
    # summary.json records it; no two replicas share one.
    cores = {}
    for replica in ordeal_cluster.replicas():
        tree = group_members(replica.pid)
        assert len(tree) >= 3, tree  # API server, engine core, worker
        cores[replica.name] = {tuple(sorted(os.sched_getaffinity(p))) for p in tree}
        recorded = {n["name"]: n["cpus"] for n in ordeal_cluster.describe()["nodes"]}
        assert cores[replica.name] == {tuple(recorded[replica.name])}, (cores, recorded)
    [a], [b] = cores.values()
    assert not set(a) & set(b), cores
    assert ledger.pending() == []
    assert fault.heal()["already_healed"] is True  # idempotent


def test_a_paused_replica_holds_due_time_ttft_not_send_time(ordeal_cluster, tmp_path):
    """Latency from the schedule against a real replica (issue 26; the stub
    twin is tests/test_schedule_lag.py): the replica is SIGSTOPped while an
    open-loop load with two slots keeps coming due. The two in flight wait
    out the pause; the rest queue for a slot. Due-time TTFT must hold the
    queueing, send-time TTFT must not, and schedule_lag must name the limit."""
    from faults.process_pause import ProcessPause
    from invariants import ScheduleLag
    from invariants.requests import RequestPairer, Timeline
    from invariants.settings import CheckerSettings
    from invariants.slo import figure

    victim = ordeal_cluster.replicas()[0]
    ledger = Ledger(tmp_path / "ledger")
    h = History(tmp_path / "h.jsonl")
    # about 20 requests due in the first second, two slots: most of them queue
    spec = WorkloadSpec(duration_s=1.0, rate=20, seed=11, max_in_flight=2, stream_share=1.0,
                        canary_every=0, timeout_s=60)
    fault = ProcessPause(victim, "test-run", ledger)

    async def paused_load():
        load = asyncio.create_task(WorkloadRunner(spec, victim.endpoint.url, h).run())
        await asyncio.sleep(0.2)  # the first two are in flight
        fault.inject()
        try:
            await asyncio.sleep(4.0)
        finally:
            fault.heal()
        await load

    try:
        asyncio.run(paused_load())
    finally:
        fault.heal()
        h.close()
    ops = list(read_history(tmp_path / "h.jsonl"))
    pairer = RequestPairer(Timeline(30.0))
    reqs = [r for r in (pairer.feed(o) for o in ops) if r is not None]
    assert len(reqs) >= 4 and all(r.done.type == "ok" for r in reqs), [r.done.error for r in reqs]
    queued = [r for r in reqs if r.invoke.value.get("queued")]
    assert len(queued) >= len(reqs) / 2, "most requests must wait for a slot"
    for r in reqs:
        assert figure(r, "ttft_ms") == r.done.value["ttft_ms"] + figure(r, "lag_ms")
    # A queued request was sent after the pause, so its own clock saw none of it.
    worst = max(queued, key=lambda r: figure(r, "lag_ms"))
    assert figure(worst, "lag_ms") > figure(worst, "ttft_ms_sent"), worst.invoke.value
    assert figure(worst, "ttft_ms") > 2 * figure(worst, "ttft_ms_sent")
    lag = ScheduleLag().check(ops, RunContext(settings=CheckerSettings(
        max_schedule_lag_ms=figure(worst, "lag_ms") / 2)))
    assert lag.valid == "unknown" and "in-flight limit" in lag.details["why"], lag.details


def test_a_replica_that_never_gets_ready_is_reported_with_its_log(tmp_path):
    model = ensure_tiny_model(0)
    node = VllmReplica("slow-replica", Endpoint("127.0.0.1", free_ports(1)[0]), model.path,
                       tmp_path / "slow.log", "never-ready-run")
    node.start()
    try:
        with pytest.raises(NodeNotReady) as err:
            node.wait_ready(3)
        msg = str(err.value)
        assert "slow-replica is not ready" in msg and "within 3s" in msg
        assert "ConnectionRefusedError" in msg and "last log lines" in msg
        assert "ordeal: start #1" in msg and "hint:" in msg and "--ready-timeout" in msg
    finally:
        pgid = node.pid
        node.stop(grace=5)
    assert group_members(pgid) == []


def test_a_replica_with_a_broken_model_fails_fast_with_the_reason(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{not json")
    node = VllmReplica("broken-replica", Endpoint("127.0.0.1", free_ports(1)[0]),
                       tmp_path / "model", tmp_path / "broken.log", "broken-run")
    node.start()
    try:
        with pytest.raises(NodeNotReady, match="exited with code") as err:
            node.wait_ready(120)
        assert "Error" in str(err.value)  # the engine's own error is in the tail
    finally:
        node.stop(grace=5)


@pytest.mark.long(slot=1, covered_by="the broken model's start just above (the engine's own "
                  "error in a failed start) and failure_reason on vLLM's recorded out-of-memory "
                  "line in tests/test_restart_phases.py")
def test_a_replica_that_meets_too_little_memory_fails_with_vllm_s_own_reason(tmp_path):
    """The CPU form of a GPU replica restarted beside a co-tenant that holds
    the memory it needs: vLLM is asked for a KV cache larger than the
    machine (VLLM_CPU_KVCACHE_SPACE, as a user's --engine-env sets it), and
    refuses with its own words. The wait ends when the process exits, and
    its error and ``reason`` carry vLLM's line (engines/vllm/startup.py
    ``failure_reason``), which restart_readiness puts in the finding."""
    model = ensure_tiny_model(0)
    too_much = ReplicaConfig(engine_env=(("VLLM_CPU_KVCACHE_SPACE", "100000"),))  # GiB
    node = VllmReplica("hungry-replica", Endpoint("127.0.0.1", free_ports(1)[0]), model.path,
                       tmp_path / "hungry.log", "hungry-run", config=too_much)
    node.start()
    try:
        with pytest.raises(NodeNotReady, match="exited with code") as err:
            node.wait_ready(240)
    finally:
        node.stop(grace=5)
    reason = err.value.reason
    assert reason is not None and reason.startswith("out of memory: "), str(err.value)
    assert "is less than requested memory for kv" in reason, reason
    assert f"its own reason: {reason}" in str(err.value)


def test_monitor_samples_a_real_replica_and_survives_a_dead_one(ordeal_cluster):
    from load.monitor import sample_node
    from nodes.local import LocalNode

    replica = ordeal_cluster.replicas()[0]
    complete(replica.endpoint.url, "warm the counters")
    v = sample_node(replica)
    assert v["health"] == 200 and "error" not in v, v
    m = v["metrics"]
    assert m["vllm:generation_tokens_total"] >= 1 and "vllm:num_requests_running" in m
    assert v["rss_bytes"] > 200 * 2**20  # API server + engine core + worker
    dead = LocalNode("gone", "replica", Endpoint("127.0.0.1", free_ports(1)[0]),
                     replica.process, hint="")
    v = sample_node(dead, timeout=1)
    assert v["health"] is None and "/health" in v["error"] and "refused" in v["error"].lower()


def test_the_drain_waits_while_a_replica_is_busy_and_not_once_it_is_idle(ordeal_cluster,
                                                                         tmp_path):
    """``Monitor.wait_quiet`` (before the drained sample leak_bound judges):
    a replica kept decoding long answers holds it to its bound; an idle one
    lets it go at the first look."""
    import threading
    import time

    from load.monitor import Monitor, sample_node

    replica = ordeal_cluster.replicas()[0]
    monitor = Monitor([replica], History(tmp_path / "h.jsonl"))
    assert asyncio.run(monitor.wait_quiet(3.0)) < 0.5  # idle: no wait
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "count", "max_tokens": 480,
                       "ignore_eos": True, "temperature": 0}).encode()
    stop = threading.Event()

    def keep_busy() -> None:  # long answers back to back, two streams overlapping
        while not stop.is_set():
            req = urllib.request.Request(replica.endpoint.url + "/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
            urllib.request.urlopen(req, timeout=120).read()

    busy = [threading.Thread(target=keep_busy) for _ in range(2)]
    for t in busy:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while not sample_node(replica)["metrics"].get("vllm:num_requests_running"):
            assert time.monotonic() < deadline, "the long requests never showed as running"
            time.sleep(0.05)
        waited = asyncio.run(monitor.wait_quiet(1.5))
        assert 1.2 <= waited <= 2.5, waited  # held to its bound while decoding
    finally:
        stop.set()
        for t in busy:
            t.join(120)
    assert asyncio.run(monitor.wait_quiet(3.0)) < 0.5
