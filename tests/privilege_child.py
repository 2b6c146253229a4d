"""A harness that runs as an unprivileged user (tests/test_least_privilege.py
starts it with setpriv). Prints one JSON line: what it could and could not do.

    python tests/privilege_child.py processes WORKDIR
        a real HTTP server process it starts itself: root faults refused
        (packet_loss, network_partition, gpu_throttle on CPU), process_pause
        and process_kill (with restart) on its own process work
    python tests/privilege_child.py router WORKDIR CLUSTER_JSON
        a real vllm-router it starts itself in front of the session
        cluster's replicas: it serves, process_pause works on it, and a
        latency toxic on one of the cluster's proxy links works
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from engines.vllm.nodes import SERVED_MODEL_NAME, VllmRouter
from faults.base import FaultError, PrivilegeError
from faults.factory import build_faults
from faults.ledger import Ledger
from faults.process_pause import wait_states
from faults.proxy.client import ProxyClient
from nodes.local import LocalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint, Link

HEALTH_SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class Cluster:
    """The session cluster's nodes and links, as this child may address them."""

    def __init__(self, nodes: list[Any], links: list[Link]):
        self.nodes, self.links = nodes, links

    def replicas(self) -> list[Any]:
        return [n for n in self.nodes if n.role == "replica"]

    def node(self, name: str) -> Any:
        return next(n for n in self.nodes if n.name == name)

    def link(self, name: str) -> Link:
        return next(x for x in self.links if x.name == name)


def refusals(cluster: Cluster, run_id: str, ledger: Ledger, target: str) -> dict[str, str]:
    out = {}
    for kind, params in (("packet_loss", {"probability": 0.1}),
                         ("network_partition", {"mode": "reject"}),
                         ("gpu_throttle", {"backend": "cpu"})):
        [fault] = build_faults(kind, target, cluster, run_id, ledger, random.Random(0), params)
        try:
            fault.inject()
            fault.heal()
            out[kind] = "INJECTED"
        except PrivilegeError as e:
            out[kind] = str(e)
        except FaultError as e:
            out[kind] = f"other FaultError: {e}"
    return out


def get(url: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status


def complete(url: str, timeout: float = 30.0) -> float:
    body = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "hi", "max_tokens": 2,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        json.loads(resp.read())
    return time.monotonic() - t0


def processes(work: Path) -> dict[str, Any]:
    run_id = f"priv-{os.getpid()}"
    ledger = Ledger()
    port = free_ports(1, "127.0.0.1")[0]
    proc = ManagedProcess("replica-0", [sys.executable, "-c", HEALTH_SERVER, str(port)],
                          dict(os.environ), work / "server.log", run_id)
    node = LocalNode("replica-0", "replica", Endpoint("127.0.0.1", port), proc, "")
    node.start()
    out: dict[str, Any] = {"uid": os.geteuid(), "run_id": run_id}
    try:
        node.wait_ready(30)
        cluster = Cluster([node], [])
        out["refused"] = refusals(cluster, run_id, ledger, "replica-0")
        out["ledger_after_refusals"] = len(ledger.pending())
        [pause] = build_faults("process_pause", "replica-0", cluster, run_id, ledger,
                               random.Random(0))
        with pause:
            out["paused_states"] = wait_states(node.pids(), stopped=True, timeout=5) == []
            try:
                get(f"{node.endpoint.url}/", timeout=1.5)
                out["answered_while_paused"] = True
            except OSError:
                out["answered_while_paused"] = False
        out["answers_after_pause"] = get(f"{node.endpoint.url}/") == 200
        old_pid = node.pid
        [kill] = build_faults("process_kill", "replica-0", cluster, run_id, ledger,
                              random.Random(0), {"ready_timeout_s": 30})
        out["kill"] = kill.inject()
        out["killed_old_pid_gone"] = not os.path.exists(f"/proc/{old_pid}") or \
            Path(f"/proc/{old_pid}/stat").read_text().split(") ")[1][0] == "Z"
        out["kill_heal"] = kill.heal()
        out["restarted_new_pid"] = node.pid != old_pid and get(f"{node.endpoint.url}/") == 200
        out["ledger_at_end"] = len(ledger.pending())
    finally:
        node.stop()
    return out


def router(work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    run_id = f"priv-{os.getpid()}"
    ledger = Ledger()
    replicas = [LocalNode(r["name"], "replica", Endpoint(r["host"], r["port"]),
                          ManagedProcess(r["name"], ["true"], {}, work / "none.log", run_id), "")
                for r in spec["replicas"]]
    links = [Link(x["name"], x["src"], x["dst"], Endpoint(*x["listen"]),
                  Endpoint(*x["upstream"]), Endpoint(*x["control"])) for x in spec["links"]]
    ports = free_ports(2, "127.0.0.1")
    node = VllmRouter("router", Endpoint("127.0.0.1", ports[0]),
                      [r.endpoint.url for r in replicas], work / "router.log", run_id,
                      metrics_port=ports[1])
    out: dict[str, Any] = {"uid": os.geteuid(), "run_id": run_id}
    node.start()
    try:
        node.wait_ready(60)
        out["router_uid"] = os.stat(f"/proc/{node.pid}").st_uid
        out["served_s"] = round(complete(node.endpoint.url), 3)
        cluster = Cluster([*replicas, node], links)
        [pause] = build_faults("process_pause", "router", cluster, run_id, ledger,
                               random.Random(0))
        with pause:
            try:
                complete(node.endpoint.url, timeout=2.0)
                out["served_while_paused"] = True
            except OSError:
                out["served_while_paused"] = False
        out["served_after_pause_s"] = round(complete(node.endpoint.url), 3)
        link = cluster.link(spec["link"])
        [lat] = build_faults("network_latency", link.name, cluster, run_id, ledger,
                             random.Random(0), {"latency_ms": 400})
        base = min(complete(link.listen.url) for _ in range(2))
        with lat:
            out["toxics_while_injected"] = len(ProxyClient(link.control).toxics(link.name))
            slow = complete(link.listen.url)
        out["latency_added_s"] = round(slow - base, 3)
        out["toxics_after_heal"] = len(ProxyClient(link.control).toxics(link.name))
        out["ledger_at_end"] = len(ledger.pending())
    finally:
        node.signal(signal.SIGCONT)
        node.stop()
    return out


def main() -> int:
    mode, work = sys.argv[1], Path(sys.argv[2])
    if mode == "processes":
        out = processes(work)
    else:
        out = router(work, json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
