"""The fault proxy in isolation: a real proxy process between the test and
stub upstreams (an echo server, an HTTP/1.1 server with keep-alive, chunked
SSE and Content-Length bodies). Stubs are allowed here only, to test the
proxy itself; tests/test_link_faults.py puts it in front of real vLLM.

Each test observes an effect through the proxy and, where it matters, that
the same request is normal again once the toxic is removed.
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import random
import socket
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import Ledger
from faults.lsn_jump import LsnJump
from faults.proxy import ProxyClient, ProxyError, ProxyUnreachable
from faults.proxy.connection import Connection
from faults.proxy.http_parse import Body, End, Head, Opaque, ResponseParser
from faults.proxy.launch import ProxyProcess
from faults.proxy.sockets import CAN_SPLICE
from faults.proxy.toxics import REGISTRY
from load.sse import SSEParser
from nodes.ports import free_ports
from ordeal.topology import Link

REPO = Path(__file__).resolve().parent.parent


# -- stub upstreams ------------------------------------------------------------

class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        self.server.received += 0
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.server.received += len(data)
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    received = 0


def sse_event(i: int) -> bytes:
    return b"data: " + json.dumps({"i": i, "text": f"tok{i}"}).encode() + b"\n\n"


class StubHTTP(BaseHTTPRequestHandler):
    """GET /small, /big?n=, /sse?n=&gap_ms=&split_end= (chunked, one event per
    chunk; split_end=1: the last chunk written alone, later, as uvicorn does),
    /sse_len?n= (SSE with Content-Length); POST /echo, POST /sse (JSON body
    {"n": ...}, then as GET /sse)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _args(self):
        path, _, q = self.path.partition("?")
        args = dict(kv.split("=", 1) for kv in q.split("&") if "=" in kv)
        return path, args

    def do_GET(self):
        self.server.hits += 1
        path, args = self._args()
        n = int(args.get("n", 8))
        if path == "/small":
            self._send(200, b"hello", "text/plain")
        elif path == "/big":
            self._send(200, random.Random(n).randbytes(n), "application/octet-stream")
        elif path == "/sse_len":
            body = b"".join(sse_event(i) for i in range(n)) + b"data: [DONE]\n\n"
            self._send(200, body, "text/event-stream")
        elif path == "/sse":
            self._sse(n, float(args.get("gap_ms", 0)) / 1000, args.get("split_end") == "1")
        else:
            self._send(404, b"no such path", "text/plain")

    def _sse(self, n, gap, split_end=False):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for i in range(n):
                ev = sse_event(i)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                if gap:
                    time.sleep(gap)
            done = b"data: [DONE]\n\n"
            if split_end:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(done), done))
                time.sleep(0.02)
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        except OSError:
            self.close_connection = True

    def do_POST(self):
        self.server.hits += 1
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self._args()[0] == "/sse":
            self._sse(int(json.loads(body)["n"]), 0.0)
        else:
            self._send(200, body, "application/octet-stream")

    def _send(self, status, body, ctype):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class HTTPStub(ThreadingHTTPServer):
    daemon_threads = True
    hits = 0


@pytest.fixture(scope="module")
def stubs():
    echo = EchoServer(("127.0.0.1", 0), EchoHandler)
    web = HTTPStub(("127.0.0.1", 0), StubHTTP)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (echo, web)]
    for t in threads:
        t.start()
    try:
        yield echo, web
    finally:
        for s in (echo, web):
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def proxy(stubs, tmp_path_factory):
    echo, web = stubs
    log = tmp_path_factory.mktemp("proxy") / "proxy.log"
    p = ProxyProcess([f"echo=0:127.0.0.1:{echo.server_address[1]}",
                      f"http=0:127.0.0.1:{web.server_address[1]}"], seed=7, stderr_path=log)
    p.start()
    try:
        yield p
    finally:
        code = p.stop()
        assert code == 0, f"the proxy did not exit cleanly on SIGTERM (code {code}); see {log}"


@pytest.fixture
def ctl(proxy):
    client = ProxyClient(proxy.control)
    client.reset()
    yield client
    client.reset()


def echo_conn(proxy, timeout=5.0) -> socket.socket:
    ep = proxy.listens["echo"]
    return socket.create_connection((ep.host, ep.port), timeout=timeout)


def echo_rtt(proxy, payload=b"ping") -> float:
    with echo_conn(proxy) as s:
        t0 = time.monotonic()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(65536)
        assert got == payload
        return time.monotonic() - t0


def http_conn(proxy, timeout=10.0) -> http.client.HTTPConnection:
    ep = proxy.listens["http"]
    return http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)


def get(proxy, path, conn=None):
    c = conn or http_conn(proxy)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def events_of(body: bytes) -> list[str]:
    p = SSEParser()
    return [e.data for e in list(p.feed(body)) + list(p.close())]


def indexes(body: bytes) -> list:
    out = []
    for d in events_of(body):
        if d == "[DONE]":
            out.append("DONE")
        else:
            try:
                out.append(json.loads(d)["i"])
            except ValueError:
                out.append("BAD")
            except KeyError:
                out.append("ERROR" if "error" in json.loads(d) else "?")
    return out


# -- the process, the control API, the client -----------------------------------

def test_ready_health_links_and_counters(proxy, ctl, stubs):
    h = ctl.health()
    assert h["status"] == "ok" and h["links"] == 2 and h["seed"] == 7
    before = {ln["name"]: ln["counters"] for ln in ctl.links()}
    payload = os.urandom(5000)
    with echo_conn(proxy) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(65536)
    assert got == payload
    after = ctl.link("echo")["counters"]
    assert after["connections"] == before["echo"]["connections"] + 1
    assert after["bytes_up"] - before["echo"]["bytes_up"] == len(payload)
    assert after["bytes_down"] - before["echo"]["bytes_down"] == len(payload)
    [link] = [ln for ln in ctl.links() if ln["name"] == "http"]
    assert link["upstream"] == f"127.0.0.1:{stubs[1].server_address[1]}"


def test_process_title_names_the_proxy(proxy):
    comm = Path(f"/proc/{proxy.pid}/comm").read_text().strip()
    assert comm == "ordeal-proxy"


def test_no_toxic_passes_bytes_unchanged_and_keeps_alive(proxy, ctl, stubs):
    web = stubs[1]
    direct = http.client.HTTPConnection(*web.server_address, timeout=10)
    c = http_conn(proxy)
    spliced = ctl.link("http")["counters"]["bytes_spliced"]
    for path in ("/big?n=300000", "/sse?n=20", "/sse_len?n=5", "/small"):
        assert get(proxy, path, c)[2] == get(proxy, path, direct)[2]
    counters = ctl.link("http")["counters"]
    assert counters["connections"] >= 1
    # With no toxic the kernel moved the bytes (splice, the fast path).
    if CAN_SPLICE:
        assert counters["bytes_spliced"] - spliced >= 300_000, counters


def test_bytes_after_tcp_urgent_data_still_pass(proxy):
    """splice(2) stops at TCP's urgent mark while the socket stays readable:
    the relay must read past it (as recv does), not spin and drop the rest."""
    with echo_conn(proxy) as s:
        s.sendall(b"abc")
        time.sleep(0.1)
        s.send(b"!", socket.MSG_OOB)
        time.sleep(0.1)
        s.sendall(b"def")
        got = b""
        s.settimeout(5)
        while len(got) < 6:
            chunk = s.recv(64)
            if not chunk:
                break
            got += chunk
    assert got == b"abcdef", got  # the urgent byte is out of band, as with recv


@pytest.mark.skipif(not CAN_SPLICE, reason="this Python has no os.splice (Linux, 3.10+)")
def test_a_toxic_takes_the_bytes_off_the_kernel_path_and_its_removal_gives_them_back(
        proxy, ctl):
    """On one keep-alive connection: a body passes in the kernel, then
    through a toxic (delayed as it says, byte for byte), then in the kernel
    again once the toxic is gone."""
    c = http_conn(proxy)

    def fetch() -> tuple[bytes, int, float]:
        before = ctl.link("http")["counters"]["bytes_spliced"]
        t0 = time.monotonic()
        body = get(proxy, "/big?n=400000", c)[2]
        took = time.monotonic() - t0
        return body, ctl.link("http")["counters"]["bytes_spliced"] - before, took

    plain, in_kernel, _ = fetch()
    assert len(plain) == 400_000 and in_kernel >= 400_000
    ctl.add_toxic("http", "latency", name="lat", attributes={"latency_ms": 200})
    body, in_kernel, took = fetch()
    assert body == plain and took >= 0.2, took
    assert in_kernel < 1_000, in_kernel  # at most the request went up in the kernel
    ctl.remove_toxic("http", "lat")
    body, in_kernel, _ = fetch()
    assert body == plain and in_kernel >= 400_000


def test_control_api_errors_are_clear(proxy, ctl):
    cases = [
        ({"name": "a", "type": "nope"}, 400, "unknown toxic type 'nope'"),
        ({"name": "a", "type": "latency", "attributes": {"latncy_ms": 5}}, 400,
         "unknown attribute(s) ['latncy_ms']"),
        ({"name": "a", "type": "latency", "attributes": {"latency_ms": -1}}, 400,
         "below the minimum"),
        ({"name": "a", "type": "latency", "attributes": {"latency_ms": "fast"}}, 400,
         "must be a number"),
        ({"name": "a", "type": "latency", "direction": "sideways"}, 400, "direction"),
        ({"name": "a", "type": "latency", "toxicity": 1.5}, 400, "toxicity"),
        ({"name": "a", "type": "sse_drop", "direction": "upstream"}, 400, "downstream"),
        ({"name": "a", "type": "sse_reorder", "attributes": {"count": 1}}, 400, "count"),
    ]
    for body, status, words in cases:
        with pytest.raises(ProxyError) as err:
            ctl._call("POST", "/links/http/toxics", body)
        assert err.value.status == status and words in str(err.value), (body, str(err.value))
    assert ctl.toxics("http") == []  # nothing was added by a refused call
    with pytest.raises(ProxyError) as err:
        ctl.add_toxic("no-such-link", "latency")
    assert err.value.status == 404 and "no link 'no-such-link'" in str(err.value)
    ctl.add_toxic("http", "latency", name="dup")
    with pytest.raises(ProxyError) as err:
        ctl.add_toxic("http", "latency", name="dup")
    assert err.value.status == 409 and "already has a toxic named 'dup'" in str(err.value)
    assert ctl.remove_toxic("http", "dup") is True
    assert ctl.remove_toxic("http", "dup") is False  # 404: already gone
    req = __import__("urllib.request").request.Request(
        proxy.control.url + "/links/http/toxics", data=b"{not json", method="POST")
    with pytest.raises(Exception) as err:
        __import__("urllib.request").request.urlopen(req, timeout=5)
    assert getattr(err.value, "code", None) == 400


def test_reset_removes_every_toxic(ctl):
    ctl.add_toxic("http", "latency", name="l1", attributes={"latency_ms": 1})
    ctl.add_toxic("echo", "slicer", name="s1", direction="upstream")
    assert ctl.reset() == 2
    assert all(ln["toxics"] == [] for ln in ctl.links())


def test_client_reports_an_unreachable_proxy():
    port = free_ports(1)[0]
    client = ProxyClient(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(ProxyUnreachable) as err:
        client.health()
    assert err.value.refused and "is the proxy running?" in str(err.value)


def test_cli_refuses_a_non_loopback_upstream_and_bad_link_syntax():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for link, words in (("x=0:10.1.2.3:80", "not a loopback address"),
                        ("x=0:example.com:80", "is not an IP address"),
                        ("x=80", "NAME=LISTENPORT:UPSTREAMHOST:UPSTREAMPORT")):
        r = subprocess.run([sys.executable, "-m", "faults.proxy", "--link", link],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 2 and words in r.stderr, (link, r.stderr)
        assert "READY" not in r.stdout


def test_sigterm_stops_it_cleanly_with_connections_open(stubs, tmp_path):
    echo = stubs[0]
    p = ProxyProcess([f"e=0:127.0.0.1:{echo.server_address[1]}"], stderr_path=tmp_path / "l")
    p.start()
    s = socket.create_connection((p.listens["e"].host, p.listens["e"].port), timeout=5)
    try:
        s.sendall(b"x")
        assert s.recv(10) == b"x"
        assert p.stop() == 0
        assert "stopping on signal" in (tmp_path / "l").read_text()
    finally:
        s.close()


# -- L4 toxics -----------------------------------------------------------------

@pytest.mark.parametrize("direction", ["downstream", "upstream"])
def test_latency_delays_one_direction_and_heals(proxy, ctl, direction):
    base = min(echo_rtt(proxy) for _ in range(3))
    ctl.add_toxic("echo", "latency", name="lat", direction=direction,
                  attributes={"latency_ms": 300, "jitter_ms": 50})
    delayed = [echo_rtt(proxy) for _ in range(3)]
    assert all(d >= 0.25 for d in delayed), delayed  # latency - jitter, at least
    ctl.remove_toxic("echo", "lat")
    healed = min(echo_rtt(proxy) for _ in range(5))
    # Back near this run's own baseline: less than half the delay the toxic
    # added here (it adds >= 0.25 s to every round trip while present).
    assert healed - base < (min(delayed) - base) / 2, (base, delayed, healed)


def test_latency_shifts_a_stream_without_serialising_it(proxy, ctl):
    """20 events 20 ms apart under 300 ms latency: each is delayed, not each
    by 300 ms more than the one before."""
    t0 = time.monotonic()
    get(proxy, "/sse?n=20&gap_ms=20")
    plain = time.monotonic() - t0
    ctl.add_toxic("http", "latency", name="lat", attributes={"latency_ms": 300})
    t0 = time.monotonic()
    status, _, body = get(proxy, "/sse?n=20&gap_ms=20")
    delayed = time.monotonic() - t0
    assert status == 200 and indexes(body) == list(range(20)) + ["DONE"]
    assert delayed >= 0.3 and delayed < plain + 3 * 0.3, (plain, delayed)


def test_removing_a_latency_toxic_releases_held_data_at_once(proxy, ctl):
    ctl.add_toxic("echo", "latency", name="slow", attributes={"latency_ms": 30_000})
    with echo_conn(proxy, timeout=10) as s:
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(10)
        t0 = time.monotonic()
        ctl.remove_toxic("echo", "slow")
        s.settimeout(10)
        assert s.recv(10) == b"held"
        assert time.monotonic() - t0 < 5  # released by the removal, not the 30 s


def test_bandwidth_limits_the_rate_and_heals(proxy, ctl):
    n = 150_000
    t0 = time.monotonic()
    _, _, fast = get(proxy, f"/big?n={n}")
    plain = time.monotonic() - t0
    ctl.add_toxic("http", "bandwidth", name="bw", attributes={"rate_kbps": 300})
    t0 = time.monotonic()
    _, _, slow = get(proxy, f"/big?n={n}")
    limited = time.monotonic() - t0
    assert slow == fast and len(slow) == n
    assert limited >= 0.9 * n / 300_000, (plain, limited)  # 0.5 s at 300 KB/s
    ctl.remove_toxic("http", "bw")
    t0 = time.monotonic()
    get(proxy, f"/big?n={n}")
    assert time.monotonic() - t0 < limited


def test_slicer_cuts_writes_into_small_pieces(proxy, ctl):
    ctl.add_toxic("echo", "slicer", name="sl",
                  attributes={"average_size": 10, "size_variation": 4, "delay_us": 2000})
    payload = os.urandom(400)
    sizes = []
    with echo_conn(proxy) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            piece = s.recv(65536)
            sizes.append(len(piece))
            got += piece
    assert got == payload  # same bytes, in order
    # A reader that falls behind (a loaded machine) gets two pieces in one
    # recv now and then: judge the typical piece, not the largest.
    assert sorted(sizes)[len(sizes) // 2] <= 14 and len(sizes) >= len(payload) // 28, sizes


def test_timeout_zero_is_a_blackhole_that_loses_nothing_on_heal(proxy, ctl):
    ctl.add_toxic("echo", "timeout", name="bh", direction="upstream",
                  attributes={"timeout_ms": 0})
    with echo_conn(proxy, timeout=10) as s:
        s.sendall(b"one")
        s.sendall(b"two")
        s.settimeout(0.7)
        with pytest.raises(socket.timeout):
            s.recv(10)
        ctl.remove_toxic("echo", "bh")
        s.settimeout(5)
        got = b""
        while len(got) < 6:
            got += s.recv(10)
        assert got == b"onetwo"


def test_timeout_closes_the_connection_after_the_timeout(proxy, ctl):
    ctl.add_toxic("echo", "timeout", name="to", direction="upstream",
                  attributes={"timeout_ms": 400})
    with echo_conn(proxy, timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"lost")
        assert s.recv(10) == b""  # closed, nothing forwarded
        assert time.monotonic() - t0 >= 0.35


def test_reset_peer_resets_at_once(proxy, ctl):
    ctl.add_toxic("echo", "reset_peer", name="rst", direction="upstream")
    with echo_conn(proxy) as s:
        s.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            s.recv(10)
            s.recv(10)
    ctl.remove_toxic("echo", "rst")
    assert echo_rtt(proxy) < 5


def _read_until_reset(r) -> bytes:
    got = b""
    with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
        while True:
            piece = r.read1(65536)
            if not piece:
                break
            got += piece
        raise AssertionError("the stream ended without a reset")
    return got


def test_reset_peer_after_a_timeout_cuts_a_stream_mid_way(proxy, ctl):
    # The stub paces 40 events 100 ms apart (>= 3.9 s); a reset at 300 ms
    # lands inside unless the proxy's timer is late by seconds: no race.
    ctl.add_toxic("http", "reset_peer", name="rst", attributes={"timeout_ms": 300})
    c = http_conn(proxy)
    c.request("GET", "/sse?n=40&gap_ms=100")
    got = _read_until_reset(c.getresponse())
    n = len([i for i in indexes(got) if isinstance(i, int)])
    assert 0 < n < 40, n


def test_reset_peer_after_bytes_cuts_at_that_byte_whatever_the_pace(proxy, ctl):
    # No gaps at all: the whole stream is ready at once, so a timer would
    # race it; the byte trigger cuts at the same place every time, and the
    # bytes before the cut reach the client before the RST.
    ctl.add_toxic("http", "reset_peer", name="rst", attributes={"after_bytes": 1500})
    ep = proxy.listens["http"]
    for _ in range(5):
        got = b""
        with socket.create_connection((ep.host, ep.port), timeout=5) as s:
            s.sendall(b"GET /sse?n=200 HTTP/1.1\r\nhost: x\r\n\r\n")
            with pytest.raises(ConnectionResetError):
                while piece := s.recv(65536):
                    got += piece
                raise AssertionError(f"closed without a reset after {len(got)} bytes")
        assert len(got) == 1500, len(got)
        n = len([i for i in indexes(got.split(b"\r\n\r\n", 1)[1]) if isinstance(i, int)])
        assert 0 < n < 200, n


def test_reset_peer_refuses_both_triggers_at_once(proxy, ctl):
    with pytest.raises(Exception, match="either 'after_bytes'.*or 'timeout_ms'"):
        ctl.add_toxic("http", "reset_peer", name="rst",
                      attributes={"timeout_ms": 10, "after_bytes": 10})


def test_limit_data_closes_after_n_bytes_each_direction(proxy, ctl, stubs):
    ctl.add_toxic("http", "limit_data", name="lim", attributes={"bytes": 1000})
    ep = proxy.listens["http"]
    with socket.create_connection((ep.host, ep.port), timeout=5) as s:
        s.sendall(b"GET /big?n=50000 HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while piece := s.recv(65536):
            got += piece
    assert len(got) == 1000
    ctl.reset()
    echo = stubs[0]
    ctl.add_toxic("echo", "limit_data", name="lim-up", direction="upstream",
                  attributes={"bytes": 300})
    before = echo.received
    with echo_conn(proxy) as s:
        s.sendall(os.urandom(1000))
        got = b""
        while piece := s.recv(65536):
            got += piece
    # The connection closed after 300 bytes went up: the server got exactly
    # those, and the client's echo was cut with the connection.
    deadline = time.monotonic() + 5
    while echo.received - before < 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert echo.received - before == 300 and len(got) <= 300


def test_toxicity_is_a_per_connection_probability(proxy, ctl):
    ctl.add_toxic("echo", "latency", name="half", toxicity=0.5,
                  attributes={"latency_ms": 200})
    rtts = [echo_rtt(proxy) for _ in range(30)]
    hit = sum(r >= 0.2 for r in rtts)
    assert 4 <= hit <= 26, rtts  # P(outside) < 1e-4 for a fair coin
    ctl.reset()
    # A round trip that takes 0.2 s without any toxic is the machine's load:
    # toxicity 0 may show no more of them than the same link without a toxic.
    plain = sum(echo_rtt(proxy) >= 0.2 for _ in range(10))
    ctl.add_toxic("echo", "latency", name="never", toxicity=0.0,
                  attributes={"latency_ms": 200})
    never = sum(echo_rtt(proxy) >= 0.2 for _ in range(10))
    assert never <= plain + 1, (plain, never)  # applied at all: about 10 of 10


# -- L7 toxics -----------------------------------------------------------------

def test_http_abort_answers_instead_of_forwarding(proxy, ctl, stubs):
    web = stubs[1]
    ctl.add_toxic("http", "http_abort", name="ab", attributes={"status": 503})
    hits = web.hits
    status, headers, body = get(proxy, "/small")
    assert status == 503 and json.loads(body)["error"]["code"] == 503
    assert headers.get("x-ordeal-toxic") == "ab"
    c = http_conn(proxy)
    c.request("POST", "/echo", body=os.urandom(100_000))  # read to its end: no reset
    r = c.getresponse()
    assert r.status == 503 and r.read()
    assert web.hits == hits  # the upstream never saw either request
    assert ctl.take_toxic("http", "ab")["counters"]["responses"] == 2
    assert get(proxy, "/small")[:1] == (200,)


def test_http_delay_head_delays_the_response_head(proxy, ctl):
    ctl.add_toxic("http", "http_delay_head", name="dh", attributes={"delay_ms": 400})
    c = http_conn(proxy)
    t0 = time.monotonic()
    c.request("GET", "/small")
    r = c.getresponse()
    assert time.monotonic() - t0 >= 0.4 and r.read() == b"hello"


def test_http_hold_holds_real_work_spares_health_and_lets_go_at_removal(proxy, ctl):
    """The failure zoo's hung_backend_in_rotation: every answer held but the
    health check's, on one keep-alive connection (the path is read from the
    request line); removing the toxic releases the held one at once."""
    ctl.add_toxic("http", "http_hold", name="hold",
                  attributes={"hold_ms": 60000, "spare_prefix": "/small"})
    c = http_conn(proxy)
    t0 = time.monotonic()
    assert get(proxy, "/small", c)[2] == b"hello" and time.monotonic() - t0 < 5  # spared
    ep = proxy.listens["http"]
    with socket.create_connection((ep.host, ep.port), timeout=1.5) as held:
        held.sendall(b"GET /sse?n=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(TimeoutError):
            held.recv(100)  # held: no head within 1.5 s
        ctl.remove_toxic("http", "hold")
        held.settimeout(10)
        assert held.recv(100).startswith(b"HTTP/1.1 200")  # let go at the removal


def test_sse_stall_sends_the_first_events_then_holds_the_rest(proxy, ctl):
    """The failure zoo's decode_stall: two events come, then nothing for the
    stall, then the rest; a stream it does not pick flows at once."""
    ctl.add_toxic("http", "sse_stall", name="stall",
                  attributes={"after_events": 2, "stall_ms": 1500, "every_nth": 2})
    c = http_conn(proxy)
    t0 = time.monotonic()
    status, _, body = get(proxy, "/sse?n=6", c)
    assert status == 200 and indexes(body) == [0, 1, 2, 3, 4, 5, "DONE"]
    assert time.monotonic() - t0 >= 1.5  # picked: held after event 1
    t0 = time.monotonic()
    assert indexes(get(proxy, "/sse?n=6", c)[2]) == [0, 1, 2, 3, 4, 5, "DONE"]
    assert time.monotonic() - t0 < 1.0  # the second response: not picked
    [link] = [x for x in ctl.links() if x["name"] == "http"]
    [toxic] = [t for t in link["toxics"] if t["name"] == "stall"]
    assert toxic["counters"]["hits"] == 1


def test_sse_error_event_ends_the_stream_and_keeps_the_connection(proxy, ctl):
    ctl.add_toxic("http", "sse_error_event", name="err", attributes={"after_events": 3})
    c = http_conn(proxy)
    status, _, body = get(proxy, "/sse?n=10", c)
    assert status == 200 and indexes(body) == [0, 1, 2, "ERROR", "DONE"]
    error = json.loads(events_of(body)[3])["error"]
    assert error["code"] == 500 and "err" in error["message"]
    # Same keep-alive connection: the rest of the first stream was swallowed.
    assert get(proxy, "/small", c)[2] == b"hello"


def test_truncate_body_cuts_chunked_and_length_bodies(proxy, ctl):
    ctl.add_toxic("http", "truncate_body", name="cut", attributes={"after_bytes": 100})
    c = http_conn(proxy)
    c.request("GET", "/sse?n=10")
    r = c.getresponse()
    with pytest.raises(http.client.IncompleteRead) as err:
        r.read()
    assert len(err.value.partial) == 100
    c = http_conn(proxy)
    c.request("GET", "/big?n=5000")
    r = c.getresponse()
    with pytest.raises(http.client.IncompleteRead) as err:
        r.read()
    assert len(err.value.partial) == 100
    ctl.remove_toxic("http", "cut")
    assert len(get(proxy, "/big?n=5000")[2]) == 5000


@pytest.mark.parametrize("toxic,attrs,expected", [
    ("sse_drop", {"after_events": 2, "count": 2}, [0, 1, 4, 5, 6, 7, "DONE"]),
    ("sse_duplicate", {"after_events": 2, "count": 1}, [0, 1, 2, 2, 3, 4, 5, 6, 7, "DONE"]),
    ("sse_reorder", {"after_events": 2, "count": 3}, [0, 1, 4, 3, 2, 5, 6, 7, "DONE"]),
    ("sse_corrupt_json", {"after_events": 5}, [0, 1, 2, 3, 4, "BAD", 6, 7, "DONE"]),
])
@pytest.mark.parametrize("path", ["/sse?n=8", "/sse?n=8&gap_ms=5", "/sse_len?n=8"])
def test_sse_sequence_toxics(proxy, ctl, toxic, attrs, expected, path):
    c = http_conn(proxy)
    assert indexes(get(proxy, path, c)[2]) == list(range(8)) + ["DONE"]
    ctl.add_toxic("http", toxic, name="t", attributes=attrs)
    status, headers, body = get(proxy, path, c)  # same keep-alive connection
    assert status == 200 and indexes(body) == expected
    ctl.remove_toxic("http", "t")
    assert indexes(get(proxy, path, c)[2]) == list(range(8)) + ["DONE"]


def stream_on(c: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
              split: bool = False) -> tuple[int, bytes]:
    """One request on ``c``; ``split``: the head and the body in two writes
    50 ms apart (as a client that writes them separately may)."""
    if split:
        c.putrequest(method, path)
        c.putheader("content-type", "application/json")
        c.putheader("content-length", str(len(body or b"")))
        c.endheaders()
        time.sleep(0.05)
        c.send(body or b"")
    else:
        c.request(method, path, body=body)
    r = c.getresponse()
    return r.status, r.read()


def test_sse_toxic_bites_every_response_on_a_keep_alive_connection_opened_before_it(proxy,
                                                                                    ctl):
    """vllm-router keeps pooled keep-alive connections to each replica, opened
    long before a fault window. A toxic added while such a connection is
    idle, or mid-stream, must bite every response that starts on it
    afterwards, whatever the framing (chunked, Content-Length, last chunk
    alone, a non-SSE response between, a POST whose body comes late); the
    response whose head had passed when the toxic came is left alone (by
    design). One TCP connection throughout, counted by the proxy."""
    plain, dup = list(range(6)) + ["DONE"], [0, 1, 2, 2, 3, 4, 5, "DONE"]
    before = ctl.link("http")["counters"]["connections"]
    c = http_conn(proxy)
    assert indexes(get(proxy, "/sse?n=6", c)[2]) == plain  # used once, idle in the pool
    sock = c.sock
    c.request("GET", "/sse?n=12&gap_ms=20")
    r = c.getresponse()  # its head has passed the proxy
    ctl.add_toxic("http", "sse_duplicate", name="dup", attributes={"after_events": 2})
    assert indexes(r.read()) == list(range(12)) + ["DONE"]
    post = json.dumps({"n": 6}).encode()
    for i, (method, path, body, split) in enumerate([
            ("GET", "/sse?n=6", None, False),
            ("GET", "/sse?n=6&gap_ms=5", None, False),
            ("GET", "/sse_len?n=6", None, False),
            ("GET", "/small", None, False),
            ("GET", "/sse?n=6&split_end=1", None, False),
            ("POST", "/sse", post, False),
            ("POST", "/sse", post, True),
            ("GET", "/sse?n=6", None, False)]):
        status, got = stream_on(c, method, path, body, split)
        want = b"hello" if path == "/small" else dup
        assert status == 200 and (got if path == "/small" else indexes(got)) == want, \
            (i, method, path, split, got[:200])
    assert c.sock is sock
    assert ctl.link("http")["counters"]["connections"] == before + 1
    [toxic] = ctl.toxics("http")
    assert toxic["counters"] == {"responses": 8, "sse_responses": 7, "events_changed": 7,
                                 "hits": 7}  # hits: the events it changed
    removed = ctl.take_toxic("http", "dup")
    assert removed is not None and removed["counters"]["events_changed"] == 7
    assert indexes(get(proxy, "/sse?n=6", c)[2]) == plain
    assert c.sock is sock


def test_a_new_toxic_never_inherits_a_removed_ones_choices_on_a_connection():
    """Per-connection toxicity choices and state outlive fault windows on a
    pooled connection; they must belong to the toxic, not to its address
    (CPython gives a removed toxic's address to the next object of its
    size): a toxic that was off on this connection must not switch the next
    one off, nor lend it its byte count."""
    conn = Connection(SimpleNamespace(name="l"), 1, 7, None, None)  # type: ignore[arg-type]
    drop, dup, lim = REGISTRY["sse_drop"], REGISTRY["sse_duplicate"], REGISTRY["limit_data"]
    params = [drop.Params(), dup.Params(after_events=2), lim.Params(bytes=10)]
    gc.disable()  # a collection in between would hand out another freed block first
    try:
        for _ in range(100):
            off = drop("off", "downstream", 0.0, params[0])
            decided = conn.enabled(off)
            conn.state(off)["sent"] = 10
            address = id(off)
            del off
            on = dup("on", "downstream", 1.0, params[1])
            if id(on) == address:
                break
        else:
            pytest.skip("this interpreter never reused a removed toxic's address")
    finally:
        gc.enable()
    assert decided is False
    assert conn.enabled(on) is True
    assert conn.state(on) == {}
    fresh = lim("fresh", "downstream", 1.0, params[2])
    assert conn.state(fresh) == {}


def test_l7_stage_finds_the_next_response_after_bytes_it_could_not_frame(proxy, ctl):
    """Bytes the response parser cannot frame pass untouched and are counted;
    the next exchange on the same connection is parsed (and bitten) again,
    so one glitch does not blind the toxic for a pooled connection's life."""
    ctl.add_toxic("echo", "sse_duplicate", name="dup", attributes={"after_events": 1})
    lost = ctl.link("echo")["counters"]["l7_framing_lost"]
    body = b"".join(sse_event(i) for i in range(4)) + b"data: [DONE]\n\n"
    response = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: %d\r\n\r\n" % len(body)) + body
    with echo_conn(proxy) as s:
        bad_chunk = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
        for junk in (b"not http at all\r\n\r\n", bad_chunk):
            s.sendall(junk)  # the echo server sends it back: a "response"
            got = b""
            while len(got) < len(junk):
                got += s.recv(65536)
            assert got == junk
            s.sendall(response)
            parser, events, done = ResponseParser(), [], False
            while not done:
                piece = s.recv(65536)
                assert piece, "the echo connection closed"
                events += parser.feed(piece)
                done = any(isinstance(e, End) for e in events)
            assert not any(isinstance(e, Opaque) for e in events)
            got = b"".join(e.data for e in events if isinstance(e, Body))
            assert indexes(got) == [0, 1, 1, 2, 3, "DONE"], junk
    assert ctl.link("echo")["counters"]["l7_framing_lost"] == lost + 2


def test_lsn_jump_heal_says_what_its_toxic_did(proxy, ctl, tmp_path):
    """The heal result of a link fault carries its L7 toxics' counters, so a
    planted window that no client caught can be told apart: no response
    started through the link, or responses were rewritten and missed."""
    ep = proxy.listens["http"]
    link = Link("http", "client", "upstream", ep, ep, proxy.control)
    fault = LsnJump(link, "test-run", Ledger(tmp_path), mode="duplicate", after_events=2)
    c = http_conn(proxy)
    assert indexes(get(proxy, "/sse?n=4", c)[2]) == [0, 1, 2, 3, "DONE"]
    fault.inject()
    try:
        for _ in range(3):
            assert indexes(get(proxy, "/sse?n=4", c)[2]) == [0, 1, 2, 2, 3, "DONE"]
        assert get(proxy, "/small", c)[2] == b"hello"
    finally:
        healed = fault.heal()
    [name] = fault.toxic_names
    assert healed["removed"] == 1
    assert healed["toxic_counters"] == {name: {"responses": 4, "sse_responses": 3,
                                               "events_changed": 3, "hits": 3}}
    assert healed["effect"]["effective"] is True  # observed before the removal
    assert healed["effect"]["evidence"]["toxic_hits"] == {name: 3}
    assert indexes(get(proxy, "/sse?n=4", c)[2]) == [0, 1, 2, 3, "DONE"]


def test_sse_reorder_flushes_what_it_holds_when_the_stream_ends(proxy, ctl):
    ctl.add_toxic("http", "sse_reorder", name="r", attributes={"after_events": 6, "count": 5})
    assert indexes(get(proxy, "/sse?n=8")[2]) == [0, 1, 2, 3, 4, 5, 7, 6, "DONE"]


def test_l7_toxics_leave_other_traffic_alone(proxy, ctl):
    """Non-SSE bodies under an SSE toxic, and non-HTTP bytes under any L7
    toxic, pass byte for byte."""
    ctl.add_toxic("http", "sse_drop", name="d", attributes={"after_events": 0})
    assert len(get(proxy, "/big?n=100000")[2]) == 100000
    ctl.add_toxic("echo", "sse_drop", name="d", attributes={"after_events": 0})
    payload = os.urandom(3000)
    with echo_conn(proxy) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(65536)
    assert got == payload


# -- the response framing parser (pure) -------------------------------------------

def _responses() -> tuple[bytes, list[bytes]]:
    parts = [
        (b"HTTP/1.1 100 Continue\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
         b"5\r\nabcde\r\n3;ext=1\r\nfgh\r\n0\r\ntrailer: x\r\n\r\n", b"abcdefgh"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", b""),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", b""),
    ]
    return b"".join(p for p, _ in parts), [b for _, b in parts if b is not None]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_response_parser_keeps_every_byte_whatever_the_split(cuts):
    wire, bodies = _responses()
    parser = ResponseParser()
    events = []
    pos = 0
    for cut in cuts + [len(wire)]:
        events += parser.feed(wire[pos:pos + cut])
        pos += cut
        if pos >= len(wire):
            break
    raw = b"".join(e.raw for e in events)
    assert raw == wire
    assert not any(isinstance(e, Opaque) for e in events)
    got, current = [], b""
    for e in events:
        if isinstance(e, Body):
            current += e.data
        elif isinstance(e, End):
            got.append(current)
            current = b""
    assert got == bodies
    assert sum(isinstance(e, Head) for e in events) == 6 and parser.idle


def test_response_parser_passes_what_is_not_http_untouched():
    parser = ResponseParser()
    events = parser.feed(b"SSH-2.0-OpenSSH\r\n")
    assert [type(e) for e in events] == [Opaque] and events[0].raw == b"SSH-2.0-OpenSSH\r\n"
    assert parser.lost
    parser.resync()
    events = parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    assert [type(e) for e in events] == [Head, Body, End] and parser.idle


def test_response_parser_after_101_passes_everything_for_good():
    parser = ResponseParser()
    events = parser.feed(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"
                         b"\x81\x02hi")
    assert [type(e) for e in events] == [Head, Opaque] and events[1].raw == b"\x81\x02hi"
    parser.resync()  # a new exchange does not end a protocol switch
    events = parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert [type(e) for e in events] == [Opaque] and not parser.lost
