"""What the fault proxy costs when no toxic is active, against a direct
connection, side by side in one run.

    .venv/bin/python bench/bench_proxy.py              # stub upstream only (~30 s)
    .venv/bin/python bench/bench_proxy.py --replica    # plus a real vLLM replica (~1 min more)

Upstream: a stub HTTP/1.1 server in its own process (aiohttp). Measured
with a blocking socket client, alternating direct and proxied requests so
both see the same machine load:
- added latency of a small request on a keep-alive connection, p50 and p99;
- the same on a new connection per request (connect + request + answer);
- throughput of one large download (MB/s).
With --replica, GET /health and a 16-token greedy completion against a
real replica, direct and through the proxy. Each figure is read against its
direct twin; absolute numbers depend on the machine.
Writes bench/results/proxy.json and proxy.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from faults.proxy.launch import ProxyProcess  # noqa: E402
from bench.common import utc_now  # noqa: E402
from nodes.ports import free_ports  # noqa: E402

STUB = r"""
import sys
from aiohttp import web
BLOCK = b"x" * (256 * 1024)
async def small(request):
    return web.Response(body=b"ok")
async def big(request):
    n = int(request.query["n"])
    resp = web.StreamResponse(headers={"content-length": str(n)})
    await resp.prepare(request)
    while n > 0:
        await resp.write(BLOCK[:n])
        n -= len(BLOCK)
    return resp
app = web.Application()
app.router.add_get("/small", small)
app.router.add_get("/big", big)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def read_response(sock: socket.socket, buf: bytearray) -> int:
    """Read one Content-Length response; returns the body length."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError("closed before the head")
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    got = len(rest)
    view = memoryview(buf)
    while got < length:
        n = sock.recv_into(view, min(len(buf), length - got))
        if not n:
            raise ConnectionError("closed mid-body")
        got += n
    return length


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency_keepalive(addrs: dict[str, tuple[str, int]], n: int) -> dict[str, list[float]]:
    socks = {k: socket.create_connection(a) for k, a in addrs.items()}
    buf = bytearray(1 << 16)
    out: dict[str, list[float]] = {k: [] for k in addrs}
    req = b"GET /small HTTP/1.1\r\nhost: bench\r\n\r\n"
    try:
        for i in range(n + 50):
            for k, s in socks.items():
                t0 = time.perf_counter()
                s.sendall(req)
                read_response(s, buf)
                if i >= 50:  # warm-up
                    out[k].append((time.perf_counter() - t0) * 1e3)
    finally:
        for s in socks.values():
            s.close()
    return out


def latency_new_conn(addrs: dict[str, tuple[str, int]], n: int) -> dict[str, list[float]]:
    buf = bytearray(1 << 16)
    out: dict[str, list[float]] = {k: [] for k in addrs}
    req = b"GET /small HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n"
    for _ in range(n):
        for k, a in addrs.items():
            t0 = time.perf_counter()
            with socket.create_connection(a) as s:
                s.sendall(req)
                read_response(s, buf)
            out[k].append((time.perf_counter() - t0) * 1e3)
    return out


def throughput(addrs: dict[str, tuple[str, int]], size: int, reps: int) -> dict[str, list[float]]:
    buf = bytearray(1 << 20)
    out: dict[str, list[float]] = {k: [] for k in addrs}
    req = f"GET /big?n={size} HTTP/1.1\r\nhost: bench\r\n\r\n".encode()
    for _ in range(reps):
        for k, a in addrs.items():
            with socket.create_connection(a) as s:
                t0 = time.perf_counter()
                s.sendall(req)
                assert read_response(s, buf) == size
                out[k].append(size / (time.perf_counter() - t0) / 1e6)
    return out


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"p50": round(statistics.median(v), 3), "p99": round(pct(v, 0.99), 3),
                "n": len(v)} for k, v in samples.items()}


def replica_rows(n: int) -> dict[str, dict[str, dict[str, float]]]:
    import os

    from engines.vllm.model import ensure_tiny_model
    from engines.vllm.nodes import VllmReplica
    from ordeal.topology import Endpoint

    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-proxy-"))
    os.environ.setdefault("ORDEAL_STATE_DIR", str(tmp / "state"))
    port = free_ports(1)[0]
    rep = VllmReplica("bench-replica", Endpoint("127.0.0.1", port), ensure_tiny_model(0).path,
                      tmp / "replica.log", "bench-proxy")
    rep.start()
    try:
        rep.wait_ready(300)
        with ProxyProcess([f"r=0:127.0.0.1:{port}"], stderr_path=tmp / "proxy.log") as px:
            urls = {"direct": rep.endpoint.url, "proxy": px.listens["r"].url}
            body = json.dumps({"model": "ordeal-tiny", "prompt": "the quick brown fox",
                               "max_tokens": 16, "temperature": 0}).encode()
            rows: dict[str, dict[str, list[float]]] = {"health": {k: [] for k in urls},
                                                       "completion_16": {k: [] for k in urls}}
            for i in range(n + 5):
                for k, base in urls.items():
                    for row, req in (("health", urllib.request.Request(base + "/health")),
                                     ("completion_16", urllib.request.Request(
                                         base + "/v1/completions", data=body,
                                         headers={"content-type": "application/json"}))):
                        t0 = time.perf_counter()
                        with urllib.request.urlopen(req, timeout=60) as r:
                            r.read()
                        if i >= 5:
                            rows[row][k].append((time.perf_counter() - t0) * 1e3)
            return {row: summarize(v) for row, v in rows.items()}
    finally:
        rep.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--replica", action="store_true", help="also against a real vLLM replica")
    ap.add_argument("--replica-requests", type=int, default=50)
    args = ap.parse_args()

    port = free_ports(1)[0]
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port)])
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-proxy-"))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the stub upstream did not start in 30 s")
                time.sleep(0.1)
        with ProxyProcess([f"bench=0:127.0.0.1:{port}"], stderr_path=tmp / "proxy.log") as px:
            addrs = {"direct": ("127.0.0.1", port),
                     "proxy": (px.listens["bench"].host, px.listens["bench"].port)}
            keep = summarize(latency_keepalive(addrs, args.requests))
            fresh = summarize(latency_new_conn(addrs, args.connections))
            tput = throughput(addrs, args.mb * 1_000_000, args.reps)
        rows = {
            "keepalive_small_ms": keep,
            "new_connection_small_ms": fresh,
            "download_MBps": {k: {"median": round(statistics.median(v), 1),
                                  "runs": [round(x, 1) for x in v]} for k, v in tput.items()},
        }
    finally:
        stub.terminate()
        stub.wait(10)
    if args.replica:
        rows["replica_ms"] = replica_rows(args.replica_requests)

    result = {"machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
              "args": vars(args), "rows": rows}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "proxy.json").write_text(json.dumps({**result, "written_utc": utc_now()},
                                               indent=2) + "\n")
    lines = ["| measure | direct | through proxy (no toxic) | added |", "|---|---:|---:|---:|"]
    for name in ("keepalive_small_ms", "new_connection_small_ms"):
        d, p = rows[name]["direct"], rows[name]["proxy"]
        for q in ("p50", "p99"):
            lines.append(f"| {name} {q} | {d[q]:.3f} ms | {p[q]:.3f} ms | "
                         f"+{p[q] - d[q]:.3f} ms |")
    d, p = rows["download_MBps"]["direct"]["median"], rows["download_MBps"]["proxy"]["median"]
    lines.append(f"| download {args.mb} MB, median of {args.reps} | {d} MB/s | {p} MB/s | "
                 f"x{p / d:.2f} |")
    for row, v in rows.get("replica_ms", {}).items():
        for q in ("p50", "p99"):
            dd, pp = v["direct"][q], v["proxy"][q]
            lines.append(f"| vLLM replica {row} {q} | {dd:.2f} ms | {pp:.2f} ms | "
                         f"+{pp - dd:.2f} ms |")
    md = ("# Fault proxy overhead (no toxic) vs a direct connection\n\n"
          f"One run, alternating direct and proxied requests; {args.requests} keep-alive "
          f"requests, {args.connections} new connections.\n\n" + "\n".join(lines) + "\n")
    (res / "proxy.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
