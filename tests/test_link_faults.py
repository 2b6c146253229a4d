"""The five link faults (network_latency, bandwidth_limit, connection_reset,
http_fault, lsn_jump) through the fault proxy.

Against a REAL vLLM replica behind the proxy (marked ``cluster``): each kind's
effect is observed while injected (a probe sees the delay, a slower
transfer, a reset, a 5xx / error event / truncated or malformed stream, a
gap, repeat or swap in the token sequence) and the heal is observed (the
same probe is normal again).

Without vLLM (a proxy whose upstream need not exist, since toxics are
managed on the proxy alone): for each kind, a harness process injects the
fault and is SIGKILLed, then ``python -m faults heal-all`` must leave the
proxy without toxics; and faults against a missing link, a dead proxy or a
non-loopback address fail with FaultError and change nothing.
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
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from faults import FaultError, Ledger
from faults.bandwidth_limit import BandwidthLimit
from faults.connection_reset import ConnectionReset
from faults.http_fault import HttpFault
from faults.lsn_jump import LsnJump
from faults.network_latency import NetworkLatency
from faults.proxy import ProxyClient
from faults.proxy.launch import ProxyProcess
from invariants import RunContext, StreamWellFormed
from invariants.usage import UsageMatchesTokens
from load.client import Outcome, send_request
from load.plan import PlannedRequest
from load.spec import CANARY_PROMPTS
from nodes.ports import free_ports
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from ordeal.topology import Endpoint, Link

REPO = Path(__file__).resolve().parent.parent
KINDS = {
    "network_latency": (NetworkLatency, {"latency_ms": 100, "direction": "both"}),
    "bandwidth_limit": (BandwidthLimit, {"rate_kbps": 10, "slice_average_size": 16}),
    "connection_reset": (ConnectionReset, {"timeout_ms": 0}),
    "http_fault": (HttpFault, {"mode": "error_event", "after_events": 1}),
    "lsn_jump": (LsnJump, {"mode": "reorder", "after_events": 1}),
}


def make_link(name: str, listen: Endpoint, upstream: Endpoint, control: Endpoint) -> Link:
    return Link(name, "client", "upstream", listen, upstream, control)


# -- without vLLM: crash and bad targets -------------------------------------------

@pytest.fixture(scope="module")
def bare_proxy(tmp_path_factory):
    """A proxy whose upstream port has nothing behind it: enough to manage toxics."""
    dead_upstream = free_ports(1)[0]
    p = ProxyProcess([f"lf=0:127.0.0.1:{dead_upstream}"], seed=3,
                     stderr_path=tmp_path_factory.mktemp("bare") / "proxy.log")
    p.start()
    try:
        yield p, make_link("lf", p.listens["lf"], Endpoint("127.0.0.1", dead_upstream),
                           p.control)
    finally:
        p.stop()


CHILD = r"""
import json, sys, time
from faults.catalogue import REGISTRY
from faults.ledger import Ledger
from ordeal.topology import Endpoint, Link
spec = json.loads(sys.argv[1])
link = Link(spec["name"], "client", "upstream", Endpoint(*spec["listen"]),
            Endpoint(*spec["upstream"]), Endpoint(*spec["control"]))
fault = REGISTRY[spec["kind"]](link, "crashed-run", Ledger(), **spec["params"])
fault.inject()
print("INJECTED", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_harness_killed_mid_fault_then_heal_all_leaves_no_toxic(bare_proxy, kind):
    proxy, link = bare_proxy
    client = ProxyClient(link.control)
    client.reset()
    spec = {"kind": kind, "params": KINDS[kind][1], "name": link.name,
            "listen": [link.listen.host, link.listen.port],
            "upstream": [link.upstream.host, link.upstream.port],
            "control": [link.control.host, link.control.port]}
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # same ORDEAL_STATE_DIR as this test
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        assert line == "INJECTED", (line, child.stderr.read() if child.poll() else "")
        toxics = client.toxics(link.name)
        assert toxics and all(t["name"].startswith(f"ordeal-{kind}-") for t in toxics)
        [entry] = Ledger().pending()
        assert entry.kind == kind and entry.owner.pid == child.pid
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
        child.stderr.close()
    assert client.toxics(link.name)  # the harness died; its toxics did not
    r = subprocess.run([sys.executable, "-m", "faults", "heal-all"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"healed {kind} on {link.name}" in r.stdout and f"removed {len(toxics)}" in r.stdout
    assert client.toxics(link.name) == []
    assert Ledger().pending() == []


def _refused(fault, client: ProxyClient | None, words: str) -> None:
    before = client.links() if client else None
    with pytest.raises(FaultError) as err:
        fault.inject()
    assert words in str(err.value), str(err.value)
    assert Ledger().pending() == [] and not fault.active
    if client:
        assert client.links() == before  # nothing changed on the proxy


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_targets_are_refused_and_change_nothing(bare_proxy, kind):
    proxy, link = bare_proxy
    cls, params = KINDS[kind]
    client = ProxyClient(link.control)
    client.reset()
    ledger = Ledger()
    unknown = make_link("no-such-link", link.listen, link.upstream, link.control)
    _refused(cls(unknown, "r", ledger, **params), client, "has no link 'no-such-link'")
    dead = make_link(link.name, link.listen, link.upstream,
                     Endpoint("127.0.0.1", free_ports(1)[0]))
    _refused(cls(dead, "r", ledger, **params), None, "unreachable")
    for field in ("listen", "upstream", "control"):
        eps = {"listen": link.listen, "upstream": link.upstream, "control": link.control}
        eps[field] = Endpoint("10.20.30.40", 80)
        outside = make_link(link.name, eps["listen"], eps["upstream"], eps["control"])
        _refused(cls(outside, "r", ledger, **params), client, f"{field} address")


def test_bad_parameters_are_refused_before_anything_changes(bare_proxy):
    proxy, link = bare_proxy
    client = ProxyClient(link.control)
    client.reset()
    ledger = Ledger()
    _refused(NetworkLatency(link, "r", ledger, latency_ms=-5), client, "below the minimum")
    _refused(LsnJump(link, "r", ledger, mode="reorder", count=1), client, "count")
    _refused(HttpFault(link, "r", ledger, mode="truncate", after_events=3), client,
             "unknown attribute")
    with pytest.raises(FaultError, match="unknown mode 'sideways'"):
        LsnJump(link, "r", ledger, mode="sideways")
    with pytest.raises(FaultError, match="direction 'up'"):
        NetworkLatency(link, "r", ledger, direction="up")


def test_heal_after_the_proxy_died_says_there_is_nothing_to_heal(tmp_path):
    p = ProxyProcess([f"gone=0:127.0.0.1:{free_ports(1)[0]}"], stderr_path=tmp_path / "l")
    p.start()
    link = make_link("gone", p.listens["gone"], Endpoint("127.0.0.1", 1), p.control)
    ledger = Ledger()
    fault = NetworkLatency(link, "r", ledger, latency_ms=50)
    fault.inject()
    [entry] = ledger.pending()
    p.stop()
    from faults.heal_all import heal_entry
    assert "is gone, so its toxics are gone: nothing to heal" in heal_entry(entry)
    healed = fault.heal()
    assert healed["proxy"] == "gone" and ledger.pending() == []


# -- against a real vLLM replica -----------------------------------------------------

@pytest.fixture(scope="module")
def vllm_link(one_replica, tmp_path_factory):
    """A proxy in front of the real replica shared with the host and kernel
    fault modules (tests/conftest.py ``one_replica``), for the whole module."""
    base = tmp_path_factory.mktemp("link-faults")
    port = one_replica.endpoint.port
    proxy = ProxyProcess([f"client-replica=0:127.0.0.1:{port}"], seed=11,
                         stderr_path=base / "proxy.log")
    try:
        proxy.start()
        yield one_replica, make_link("client-replica", proxy.listens["client-replica"],
                                     one_replica.endpoint, proxy.control)
    finally:
        proxy.stop()


def probe(url: str, timeout: float = 30) -> tuple[float, bytes]:
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return time.monotonic() - t0, body


def stream(base_url: str, max_tokens: int = 16, prompt: str = CANARY_PROMPTS[0],
           timeout: float = 60) -> Outcome:
    req = PlannedRequest(0, 0.0, "completions", True, prompt, max_tokens, 0.0, True)

    async def go() -> Outcome:
        async with aiohttp.ClientSession() as s:
            return await send_request(s, base_url, req, "ordeal-tiny", timeout,
                                      return_token_ids=True)
    return asyncio.run(go())


def judge(outcomes: list[Outcome], tmp_path: Path, max_tokens: int = 16):
    """Run the checkers over a history of these requests."""
    path = tmp_path / f"h{time.monotonic_ns()}.jsonl"
    h = History(path)
    for i, o in enumerate(outcomes):
        h.append("invoke", i, "completions", {"max_tokens": max_tokens, "stream": True})
        h.append(o.type, i, "completions", o.value, o.error)
    h.close()
    ops = list(read_history(path))
    return (StreamWellFormed().check(ops, RunContext()),
            UsageMatchesTokens().check(ops, RunContext()))


@pytest.mark.cluster
def test_network_latency_is_seen_by_a_probe_and_healed(vllm_link, tmp_path):
    replica, link = vllm_link
    url = link.listen.url + "/health"
    base = min(probe(url)[0] for _ in range(3))
    with NetworkLatency(link, "t", Ledger(), latency_ms=400, jitter_ms=50) as fault:
        idle = fault.observe()  # no request has crossed the link yet: no effect
        assert idle.effective is False and set(idle.evidence["toxic_hits"].values()) == {0}
        delayed = [probe(url)[0] for _ in range(3)]
        seen = fault.observe()
        assert seen.effective is True and sum(seen.evidence["toxic_hits"].values()) >= 3, seen
        assert all(d >= 0.35 for d in delayed), (base, delayed)
        assert fault.active and len(ProxyClient(link.control).toxics(link.name)) == 1
    healed = min(probe(url)[0] for _ in range(5))
    # Back near this run's own baseline: less than half the delay the toxic
    # added here (>= 0.35 s on every probe while present).
    assert healed - base < (min(delayed) - base) / 2, (base, delayed, healed)
    assert ProxyClient(link.control).toxics(link.name) == []


@pytest.mark.cluster
def test_bandwidth_limit_slows_a_transfer_and_heals(vllm_link):
    replica, link = vllm_link
    _, direct = probe(replica.endpoint.url + "/openapi.json")
    plain, _ = probe(link.listen.url + "/openapi.json")
    rate_kbps = max(1.0, len(direct) / 1000 / 1.5)  # ~1.5 s for this body
    with BandwidthLimit(link, "t", Ledger(), rate_kbps=rate_kbps):
        limited, body = probe(link.listen.url + "/openapi.json")
    assert body == direct  # slower, not different
    assert limited >= 0.9 * len(direct) / (rate_kbps * 1000), (plain, limited, len(direct))
    healed, _ = probe(link.listen.url + "/openapi.json")
    assert healed < limited, (plain, limited, healed)


@pytest.mark.cluster
def test_connection_reset_is_seen_by_the_client_and_healed(vllm_link, tmp_path):
    replica, link = vllm_link
    full = stream(link.listen.url, max_tokens=300)
    assert full.type == "ok", full.error
    with ConnectionReset(link, "t", Ledger(), timeout_ms=0):
        with socket.create_connection((link.listen.host, link.listen.port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            with pytest.raises(ConnectionResetError):
                s.recv(100)
                s.recv(100)
    # Cut by what has flowed, not by time: past the response head and a few
    # events, long before the 300th token, whatever this machine's speed.
    cut_after = 2000
    assert full.value["stream"]["n_chunks"] >= 100, full.value["stream"]["n_chunks"]
    with ConnectionReset(link, "t", Ledger(), after_bytes=cut_after) as fault:
        before_any = fault.observe()
        cut = stream(link.listen.url, max_tokens=300)
        seen = fault.observe()
    # The toxic counts the connections it reset, not the chunks it let by.
    assert before_any.effective is False
    assert seen.effective is True and list(seen.evidence["toxic_hits"].values()) == [1], seen
    assert cut.type == "info" and "reset" in (cut.error or "").lower(), (
        cut.error, cut.value)
    assert not cut.value["stream"]["done"]
    assert cut.value["stream"]["n_chunks"] < full.value["stream"]["n_chunks"]
    again = stream(link.listen.url, max_tokens=300)
    assert again.type == "ok" and again.value["output_hash"] == full.value["output_hash"]


@pytest.mark.cluster
def test_http_faults_are_classified_and_healed(vllm_link, tmp_path):
    replica, link = vllm_link
    ok = stream(link.listen.url)
    assert ok.type == "ok", ok.error
    seen: dict[str, Outcome] = {}
    for mode, params in (("abort", {"status": 503}), ("error_event", {"after_events": 3}),
                         ("truncate", {"after_bytes": 400}), ("malformed", {"after_events": 2}),
                         ("delay_head", {"delay_ms": 500})):
        with HttpFault(link, "t", Ledger(), mode=mode, **params) as fault:
            seen[mode] = stream(link.listen.url)
            effect = fault.observe()
            assert effect.effective is True, (mode, effect)
    assert seen["abort"].type == "info" and seen["abort"].value["status"] == 503
    assert "ordeal http_abort" in seen["abort"].error
    assert seen["error_event"].type == "fail"
    assert "error event in stream" in seen["error_event"].error
    assert seen["error_event"].value["stream"]["n_chunks"] == 3
    assert seen["truncate"].type == "info" and not seen["truncate"].value["stream"]["done"]
    assert seen["malformed"].type == "fail" and "malformed" in seen["malformed"].error
    assert seen["delay_head"].type == "ok"
    assert seen["delay_head"].value["ttft_ms"] >= 500 > ok.value["ttft_ms"]
    wellformed, _ = judge([ok] + list(seen.values()), tmp_path)
    assert wellformed.valid is False  # the malformed event is a server fault
    assert wellformed.details["mid_stream_errors"] == 1
    assert len(wellformed.counterexamples) == 1
    healed = stream(link.listen.url)
    assert healed.type == "ok" and healed.value["output_hash"] == ok.value["output_hash"]


def _is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(x in it for x in short)


@pytest.mark.cluster
def test_lsn_jump_drop_duplicate_reorder_are_caught_and_healed(vllm_link, tmp_path):
    replica, link = vllm_link
    base = stream(link.listen.url)
    assert base.type == "ok", base.error
    ids = base.value["token_ids"]
    texts = base.value["stream"]["texts"]  # each event's text
    last = len(texts) - 1  # the event that carries finish_reason
    # A place where two neighbouring events differ, so a swap is visible.
    swap_at = next(i for i in range(1, last) if texts[i] != texts[i + 1])

    def under(mode: str, after: int, count: int | None = None) -> Outcome:
        with LsnJump(link, "t", Ledger(), mode=mode, after_events=after, count=count):
            return stream(link.listen.url)

    drop, dup, swap = under("drop", 3), under("duplicate", 3), under("reorder", swap_at)
    for o in (drop, dup, swap):
        assert o.type == "ok", o.error  # still framed well: only the sequence jumped
    assert len(drop.value["token_ids"]) < len(ids) and _is_subsequence(drop.value["token_ids"], ids)
    assert len(dup.value["token_ids"]) > len(ids) and _is_subsequence(ids, dup.value["token_ids"])
    assert swap.value["token_ids"] != ids and Counter(swap.value["token_ids"]) == Counter(ids)
    wellformed, usage = judge([drop, dup], tmp_path)
    assert usage.valid is False and usage.details["violations"] == 2  # tokens != usage
    # A jump over the finish event breaks the stream's shape itself. The
    # window spans a few events either side of it: under load vLLM may merge
    # tokens into fewer events than the baseline had.
    lost_finish = under("drop", max(0, last - 2), 8)
    twice_finish = under("duplicate", max(0, last - 2), 8)
    wellformed, _ = judge([lost_finish, twice_finish], tmp_path)
    assert wellformed.valid is False and len(wellformed.counterexamples) == 2, (
        last, [o.value["stream"]["finish_reasons"] for o in (lost_finish, twice_finish)])
    problems = " ".join(p for c in wellformed.counterexamples for p in c["problems"])
    assert "saw 0" in problems and "saw 2" in problems
    healed = stream(link.listen.url)
    assert healed.type == "ok" and healed.value["token_ids"] == ids
    wellformed, usage = judge([healed], tmp_path)
    assert wellformed.valid is True and usage.valid is True
