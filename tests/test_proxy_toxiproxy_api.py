"""The fault proxy's Toxiproxy face (faults/proxy/toxiproxy_api.py), driven
by ``toxiproxy-python`` itself and by plain HTTP/JSON calls as Toxiproxy's
README writes them, against a real proxy process. The upstream is a stub
echo server (allowed here: this tests the proxy in isolation).

Every effect is observed through the proxy: a delay against the same test's
own baseline round trip, a refused connection, bytes that do or do not
come back. ``/links`` (our face) is read to show both faces are one set of
links and toxics.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from faults.proxy import ProxyClient
from faults.proxy.launch import ProxyProcess
from nodes.ports import free_ports

pytestmark = pytest.mark.timeout(120)


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def echo():
    server = EchoServer(("127.0.0.1", 0), EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def proxy(echo, tmp_path_factory):
    """One proxy process with one command-line link ("cli"); the tests make
    their own proxies over the Toxiproxy API."""
    log = tmp_path_factory.mktemp("toxiproxy-api") / "proxy.log"
    p = ProxyProcess([f"cli=0:{echo}"], seed=3, stderr_path=log)
    p.start()
    try:
        yield p
    finally:
        code = p.stop()
        assert code == 0, f"the proxy did not exit cleanly on SIGTERM (code {code}); see {log}"


@pytest.fixture
def tp(proxy):
    """toxiproxy-python pointed at the proxy's control port; afterwards
    every toxic removed and every proxy the test made deleted."""
    server = Toxiproxy()
    server.update_api_consumer(proxy.control.host, proxy.control.port)
    yield server
    server.reset()
    for name, p in server.proxies().items():
        if name != "cli":
            p.destroy()


# -- helpers ---------------------------------------------------------------------

def address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def rtt(listen: str, payload: bytes = b"ping") -> float:
    """One round trip through a fresh connection (connect not counted)."""
    with socket.create_connection(address(listen), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            piece = s.recv(65536)
            assert piece, "the proxy closed the connection"
            got += piece
        assert got == payload
        return time.monotonic() - t0


def refused(listen: str) -> bool:
    try:
        socket.create_connection(address(listen), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def call(proxy, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A raw call with urllib: (status, decoded JSON body or None)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(proxy.control.url + path, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def our_toxics(proxy, link: str) -> list[dict[str, Any]]:
    return ProxyClient(proxy.control).toxics(link)


# -- toxiproxy-python --------------------------------------------------------------

def test_version_and_command_line_links_are_proxies(proxy, tp):
    assert tp.running()
    version = json.loads(tp.version())["version"]
    assert version.startswith("2.") and version.endswith("+ordeal"), version
    cli = tp.get_proxy("cli")
    assert cli is not None and cli.enabled is True
    ep = proxy.listens["cli"]
    assert cli.listen == f"{ep.host}:{ep.port}"
    assert rtt(cli.listen) >= 0  # it forwards


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_created_proxy_forwards_and_a_latency_toxic_delays_then_heals(proxy, tp, echo, stream):
    p = tp.create(upstream=echo, name=f"lat-{stream}")
    assert p.listen.startswith("127.0.0.1:") and not p.listen.endswith(":0"), p.listen
    base = min(rtt(p.listen) for _ in range(5))
    p.add_toxic(type="latency", stream=stream, attributes={"latency": 400})
    name = f"latency_{stream}"  # Toxiproxy's default name: <type>_<stream>
    toxic = p.get_toxic(name)
    assert toxic is not None and toxic.stream == stream
    assert toxic.attributes == {"latency": 400, "jitter": 0} and toxic.toxicity == 1.0
    [ours] = our_toxics(proxy, p.name)  # the same toxic, in our face's words
    assert (ours["type"], ours["direction"], ours["attributes"]) == (
        "latency", stream, {"latency_ms": 400.0, "jitter_ms": 0.0})
    delayed = [rtt(p.listen) for _ in range(3)]
    # The toxic holds each chunk 400 ms from when it was read: every round
    # trip takes at least that, whatever the machine's load.
    assert min(delayed) >= 0.4, (base, delayed)
    assert min(delayed) > 3 * base, (base, delayed)  # the delay dominates the baseline
    p.destroy_toxic(name)
    assert p.toxics() == {} and our_toxics(proxy, p.name) == []
    healed = min(rtt(p.listen) for _ in range(5))
    # Back near this test's own baseline: less than half the delay the toxic added.
    assert healed - base < (min(delayed) - base) / 2, (base, delayed, healed)


def test_toxicity_zero_leaves_connections_untouched(proxy, tp, echo):
    p = tp.create(upstream=echo, name="nontoxic")
    base = min(rtt(p.listen) for _ in range(5))
    p.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 30_000})
    assert p.get_toxic("latency_downstream").toxicity == 0.0
    untouched = min(rtt(p.listen) for _ in range(3))
    assert untouched - base < 15, (base, untouched)  # half the 30 s it would add
    p.destroy_toxic("latency_downstream")
    p.add_toxic(type="latency", toxicity=1.0, attributes={"latency": 30_000})
    with socket.create_connection(address(p.listen), timeout=10) as s:
        s.sendall(b"held")
        s.settimeout(1.0)
        with pytest.raises(socket.timeout):  # the same toxic at toxicity 1 holds it
            s.recv(10)
        p.destroy_toxic("latency_downstream")  # removal releases it at once
        s.settimeout(10)
        assert s.recv(10) == b"held"


def test_bandwidth_rate_is_kilobytes_per_second(proxy, tp, echo):
    p = tp.create(upstream=echo, name="slow")
    payload = bytes(range(256)) * 240  # 61 440 bytes
    base = min(rtt(p.listen, payload) for _ in range(3))  # the best of three: a busy core
    p.add_toxic(type="bandwidth", attributes={"rate": 100})  # 100 KB/s = 100 000 bytes/s
    assert our_toxics(proxy, "slow")[0]["attributes"] == {"rate_kbps": 100.0}
    limited = rtt(p.listen, payload)  # the bytes came back whole (rtt checks)
    assert limited >= 0.9 * len(payload) / 100_000, (base, limited)  # ~0.61 s
    assert limited > 5 * base, (base, limited)


def test_disable_refuses_and_drops_connections_and_enable_accepts_again(proxy, tp, echo):
    p = tp.create(upstream=echo, name="flappy")
    listen = p.listen
    held = socket.create_connection(address(listen), timeout=10)
    try:
        held.sendall(b"a")
        assert held.recv(10) == b"a"
        with p.down():
            assert tp.get_proxy("flappy").enabled is False
            assert refused(listen), "a disabled proxy still accepts connections"
            try:
                cut = held.recv(10) == b""
            except ConnectionResetError:
                cut = True
            assert cut, "a disabled proxy kept its open connection"
        assert tp.get_proxy("flappy").enabled is True
        assert tp.get_proxy("flappy").listen == listen  # back on the same port
        assert not refused(listen)
        assert rtt(listen) >= 0
    finally:
        held.close()


def test_reset_enables_every_proxy_and_removes_every_toxic(proxy, tp, echo):
    a = tp.create(upstream=echo, name="reset-a")
    b = tp.create(upstream=echo, name="reset-b")
    a.add_toxic(type="latency", attributes={"latency": 30_000})
    b.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    tp.get_proxy("cli").add_toxic(type="slicer", attributes={"average_size": 8, "delay": 10})
    b.disable()
    assert refused(b.listen)
    assert tp.reset() is True
    proxies = tp.proxies()
    assert all(px.enabled for px in proxies.values())
    assert all(px.toxics() == {} for px in proxies.values())
    assert all(ln["toxics"] == [] and ln["enabled"] for ln in ProxyClient(proxy.control).links())
    assert rtt(a.listen) < 15  # the 30 s latency is gone
    assert rtt(b.listen) >= 0  # listening again, the blackhole gone


def test_bad_toxics_and_unknown_names_give_clear_errors(proxy, tp, echo):
    p = tp.create(upstream=echo, name="errors")
    cases = [
        ({"type": "slow_close", "attributes": {"delay": 100}},
         ["'slow_close' is not supported", "latency", "bandwidth"]),
        ({"type": "nope"}, ["'nope' is not supported", "Toxiproxy types supported"]),
        ({"type": "latency", "attributes": {"latncy": 5}},
         ["unknown attribute 'latncy'", "latency (ms), jitter (ms)"]),
        ({"type": "latency", "attributes": {"latency": -1}},
         ["attribute 'latency' = -1", "below the minimum"]),
        ({"type": "latency", "stream": "sideways"}, ["stream 'sideways' is invalid"]),
        ({"type": "latency", "toxicity": 1.5}, ["toxicity"]),
    ]
    for kwargs, words in cases:
        with pytest.raises(InvalidToxic) as err:
            p.add_toxic(**kwargs)
        message = json.loads(err.value.args[0])["error"]
        assert all(w in message for w in words), (kwargs, message)
    assert p.toxics() == {}  # nothing was added by a refused call
    p.add_toxic(type="latency", name="dup", attributes={"latency": 1})
    status, body = call(proxy, "POST", "/proxies/errors/toxics", {"type": "latency",
                                                                  "name": "dup"})
    assert status == 409 and "toxic already exists" in body["error"], body
    with pytest.raises(NotFound):
        p.destroy_toxic("no-such-toxic")
    with pytest.raises(ProxyExists):
        tp.create(upstream=echo, name="errors")
    status, body = call(proxy, "POST", "/proxies", {"name": "errors", "upstream": echo})
    assert status == 409 and "proxy already exists" in body["error"], body


def test_proxies_listen_and_forward_only_on_loopback(proxy, tp):
    cases = [
        ({"listen": "0.0.0.0:0", "upstream": "127.0.0.1:9"}, "not a loopback address"),
        ({"upstream": "10.1.2.3:80"}, "not a loopback address"),
        ({"upstream": "example.com:80"}, "is not an IP address"),
        ({"upstream": "127.0.0.1"}, "write HOST:PORT"),
        ({"listen": ":0", "upstream": "127.0.0.1:9"}, "write HOST:PORT"),
    ]
    for fields, words in cases:
        status, body = call(proxy, "POST", "/proxies", {"name": "far", **fields})
        assert status == 400 and words in body["error"] and body["status"] == 400, (fields, body)
    assert "far" not in tp.proxies()


# -- raw JSON, as Toxiproxy's README writes the calls ------------------------------

def test_raw_json_calls_as_in_toxiproxy_readme(proxy, echo):
    status, created = call(proxy, "POST", "/proxies",
                           {"name": "raw", "listen": "localhost:0", "upstream": echo})
    assert status == 201 and created["enabled"] is True and created["toxics"] == [], created
    assert created["listen"].startswith("127.0.0.1:") and created["upstream"] == echo
    listen = created["listen"]
    try:
        base = min(rtt(listen) for _ in range(5))
        status, toxic = call(proxy, "POST", "/proxies/raw/toxics",
                             {"type": "latency", "attributes": {"latency": 300}})
        assert status == 200 and toxic == {"name": "latency_downstream", "type": "latency",
                                           "stream": "downstream", "toxicity": 1.0,
                                           "attributes": {"latency": 300, "jitter": 0}}, toxic
        # Update: the attributes given replace theirs, the rest is kept.
        status, toxic = call(proxy, "POST", "/proxies/raw/toxics/latency_downstream",
                             {"attributes": {"jitter": 20}})
        assert status == 200 and toxic["attributes"] == {"latency": 300, "jitter": 20}, toxic
        status, toxic = call(proxy, "PATCH", "/proxies/raw/toxics/latency_downstream",
                             {"toxicity": 1})
        assert status == 200 and toxic["attributes"]["jitter"] == 20, toxic
        assert call(proxy, "GET", "/proxies/raw/toxics/latency_downstream")[1] == toxic
        assert call(proxy, "GET", "/proxies/raw/toxics")[1] == [toxic]
        assert call(proxy, "GET", "/proxies/raw")[1]["toxics"] == [toxic]
        assert call(proxy, "GET", "/proxies")[1]["raw"]["toxics"] == [toxic]
        delayed = rtt(listen)
        assert delayed >= 0.28 and delayed > 3 * base, (base, delayed)
        assert call(proxy, "DELETE", "/proxies/raw/toxics/latency_downstream") == (204, None)
        status, body = call(proxy, "GET", "/proxies/raw/toxics/latency_downstream")
        assert status == 404 and "toxic not found" in body["error"], body
        healed = min(rtt(listen) for _ in range(5))
        assert healed - base < (delayed - base) / 2, (base, delayed, healed)

        status, body = call(proxy, "POST", "/proxies/raw", {"enabled": False})
        assert status == 200 and body["enabled"] is False and refused(listen), body
        status, body = call(proxy, "POST", "/reset")
        assert status == 200 and body["enabled"] == ["raw"] and not refused(listen), body
    finally:
        assert call(proxy, "DELETE", "/proxies/raw") == (204, None)
    assert refused(listen)  # deleted: nothing listens there
    status, body = call(proxy, "GET", "/proxies/raw")
    assert status == 404 and body["status"] == 404 and "proxy not found" in body["error"]


def test_update_moves_a_proxy_to_a_new_listen_address(proxy, echo):
    status, created = call(proxy, "POST", "/proxies", {"name": "mover", "upstream": echo})
    assert status == 201, created
    old = created["listen"]
    try:
        call(proxy, "POST", "/proxies/mover/toxics", {"type": "limit_data",
                                                      "attributes": {"bytes": 1 << 20}})
        new = f"127.0.0.1:{free_ports(1)[0]}"
        status, body = call(proxy, "POST", "/proxies/mover", {"listen": new})
        assert status == 200 and body["listen"] == new and body["enabled"] is True, body
        assert len(body["toxics"]) == 1  # toxics stay with the proxy
        assert refused(old) and rtt(new) >= 0
    finally:
        call(proxy, "DELETE", "/proxies/mover")


def test_populate_creates_keeps_and_replaces(proxy, echo):
    first = [{"name": "pop-a", "listen": "127.0.0.1:0", "upstream": echo},
             {"name": "pop-b", "listen": "127.0.0.1:0", "upstream": echo, "enabled": False}]
    try:
        status, body = call(proxy, "POST", "/populate", first)
        assert status == 201 and [p["name"] for p in body["proxies"]] == ["pop-a", "pop-b"]
        a, b = body["proxies"]
        assert a["enabled"] is True and b["enabled"] is False and refused(b["listen"])
        call(proxy, "POST", "/proxies/pop-a/toxics", {"type": "latency", "name": "keep"})
        # Toxiproxy's rule: pop-a unchanged (same listen as bound, same
        # upstream) is kept with its toxic; pop-b's upstream differs (as a
        # string), so a new pop-b, enabled by default, takes its place.
        moved = echo.replace("127.0.0.1", "localhost")
        status, body = call(proxy, "POST", "/populate",
                            [{"name": "pop-a", "listen": a["listen"], "upstream": echo},
                             {"name": "pop-b", "listen": "127.0.0.1:0", "upstream": moved}])
        assert status == 201, body
        a2, b2 = body["proxies"]
        assert a2["listen"] == a["listen"] and [t["name"] for t in a2["toxics"]] == ["keep"]
        assert b2["upstream"] == moved and b2["enabled"] is True and rtt(b2["listen"]) >= 0
        status, body = call(proxy, "POST", "/populate", [{"name": "pop-c"}])
        assert status == 400 and "upstream at proxy 1" in body["error"], body
    finally:
        for name in ("pop-a", "pop-b"):
            call(proxy, "DELETE", f"/proxies/{name}")


@pytest.mark.parametrize("ttype, attributes, ours", [
    ("latency", {"latency": 250, "jitter": 5}, {"latency_ms": 250.0, "jitter_ms": 5.0}),
    ("bandwidth", {"rate": 64}, {"rate_kbps": 64.0}),
    ("timeout", {"timeout": 1500}, {"timeout_ms": 1500}),
    ("reset_peer", {"timeout": 700}, {"timeout_ms": 700, "after_bytes": 0}),
    ("slicer", {"average_size": 32, "size_variation": 8, "delay": 150},
     {"average_size": 32, "size_variation": 8, "delay_us": 150}),
    ("limit_data", {"bytes": 4096}, {"bytes": 4096}),
])
def test_toxiproxy_attributes_map_onto_ours_and_back(proxy, ttype, attributes, ours):
    status, toxic = call(proxy, "POST", "/proxies/cli/toxics",
                         {"type": ttype, "stream": "upstream", "toxicity": 0.5,
                          "attributes": attributes})
    try:
        assert status == 200, toxic
        back = {k: v for k, v in toxic["attributes"].items() if k != "after_bytes"}
        assert back == attributes and toxic["toxicity"] == 0.5, toxic
        [mine] = our_toxics(proxy, "cli")
        assert (mine["type"], mine["direction"], mine["toxicity"], mine["attributes"]) == (
            ttype, "upstream", 0.5, ours)
    finally:
        ProxyClient(proxy.control).reset()


def test_a_browser_is_refused(proxy):
    status, body = call(proxy, "GET", "/proxies",
                        headers={"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)"})
    assert status == 403 and "browser" in body["error"], body
    assert call(proxy, "GET", "/proxies")[0] == 200


def test_a_proxy_started_with_no_link_is_driven_over_the_api(echo, tmp_path):
    """``python -m faults.proxy`` with no --link: an empty server, as
    toxiproxy-server starts, that toxiproxy-python fills."""
    with ProxyProcess([], stderr_path=tmp_path / "proxy.log") as p:
        server = Toxiproxy()
        server.update_api_consumer(p.control.host, p.control.port)
        assert server.proxies() == {}
        made = server.create(upstream=echo, name="only")
        assert list(server.proxies()) == ["only"] and rtt(made.listen) >= 0
