"""The router in front of Triton replicas: HAProxy, as a real process.

Triton has no router of its own; in production it sits behind a load
balancer (a Kubernetes Service, Envoy, NGINX or HAProxy). HAProxy (Debian's
``haproxy``, installed by .ci/setup) is one of those, and it speaks both
protocols the Triton workload uses on ONE port, so the ``client-router``
link and every fault on it cover all of the traffic:

* HTTP/1.1 (KServe v2 ``/v2/models/<m>/infer``), round robin, with active
  health checks on ``/v2/health/ready`` every second, a retry on another
  replica when a connection fails, and
* gRPC (HTTP/2 cleartext, detected by HAProxy from the connection preface),
  round robin over the replicas' gRPC ports, following the HTTP checks.
* Sequence steps carry ``x-ordeal-sequence: <correlation id>`` and stick
  to the replica that took their first step (a stick table on that header,
  ``option persist``): a sequence's state lives in one replica. They go
  elsewhere (which rejects the unknown sequence) only when a connection to
  it fails. Seen without that: a hash moved every sequence back when a
  replica returned, and without ``persist`` a step right after a pause's
  heal went to the other replica while the checks still called it down.

``/ordeal-router-health`` answers 200 while HAProxy runs (its monitor-uri).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from nodes.local import LocalNode
from nodes.process import ManagedProcess
from nodes.waits import wait_http_ok
from ordeal.topology import Endpoint

HEALTH_PATH = "/ordeal-router-health"
SEQUENCE_HEADER = "x-ordeal-sequence"


class HaproxyMissing(RuntimeError):
    pass


def haproxy_executable() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy"
                                        if os.path.exists("/usr/sbin/haproxy") else None)
    if not found:
        raise HaproxyMissing("haproxy is not installed (the router in front of Triton "
                             "replicas): apt-get install haproxy, or run bash .ci/setup as root")
    return found


def haproxy_config(listen: Endpoint, http_upstreams: Sequence[tuple[str, Endpoint]],
                   grpc_upstreams: Sequence[tuple[str, Endpoint]]) -> str:
    """The whole configuration (pure): one frontend, three backends."""
    http = "\n".join(f"  server {name} {ep.host}:{ep.port}" for name, ep in http_upstreams)
    seq = "\n".join(f"  server {name} {ep.host}:{ep.port} track http/{name}"
                    for name, ep in http_upstreams)
    grpc = "\n".join(f"  server {name} {ep.host}:{ep.port} proto h2 track http/{name}"
                     for name, ep in grpc_upstreams)
    return f"""# written by ordeal (engines/triton/haproxy.py)
global
  maxconn 4096
  log stdout format raw local0 warning

defaults
  mode http
  log global
  timeout connect 2s
  timeout client 120s
  timeout server 120s
  retries 2
  option redispatch
  retry-on conn-failure
  # Forward each chunk of a stream as it comes: without it HAProxy held a
  # generate_stream's events and sent them all at the end (measured: six
  # events 4-6 ms apart from the server arrived within 1 ms), which hides
  # time to first token from the client.
  option http-no-delay

frontend entry
  bind {listen.host}:{listen.port}
  monitor-uri {HEALTH_PATH}
  acl is_grpc req.hdr(content-type) -m beg application/grpc
  acl is_sequence req.hdr({SEQUENCE_HEADER}) -m found
  use_backend grpc if is_grpc
  use_backend sequence if is_sequence
  default_backend http

backend http
  balance roundrobin
  option httpchk GET /v2/health/ready
  http-check expect status 200
  default-server check inter 1s fall 2 rise 1
  # Which replica answered, for any model (Ordeal's own also say it in an
  # output; a user's model does not).
  http-response set-header x-ordeal-node %s
{http}

backend sequence
  balance roundrobin
  stick-table type string len 40 size 100k expire 10m
  stick on req.hdr({SEQUENCE_HEADER})
  # A sequence goes to its replica even while checks call it down (a paused
  # node answers late, not never); only a failed connection redispatches.
  option persist
  http-response set-header x-ordeal-node %s
{seq}

backend grpc
  balance roundrobin
{grpc}
"""


def haproxy_version(executable: str) -> str:
    out = subprocess.run([executable, "-v"], capture_output=True, text=True, timeout=10).stdout
    first = out.split("\n", 1)[0].split()  # "HAProxy version 2.6.12-1+deb12u3 2025/10/03 ..."
    return first[2] if len(first) > 2 else "?"


class HaproxyRouter(LocalNode):
    def __init__(self, name: str, endpoint: Endpoint, http_upstreams: Sequence[tuple[str, Endpoint]],
                 grpc_upstreams: Sequence[tuple[str, Endpoint]], log_path: Path, cluster_id: str):
        exe = haproxy_executable()
        self.config_path = log_path.with_suffix(".cfg")
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(haproxy_config(endpoint, http_upstreams, grpc_upstreams))
        argv = [exe, "-db", "-f", str(self.config_path)]  # -db: foreground, no daemon
        super().__init__(name, "router", endpoint,
                         ManagedProcess(name, argv, dict(os.environ), log_path, cluster_id),
                         hint=f"see {log_path} and the config {self.config_path}; "
                              f"check it with `haproxy -c -f {self.config_path}`")
        self.health_url = f"{endpoint.url}{HEALTH_PATH}"
        self._version = haproxy_version(exe)

    def wait_ready(self, timeout: float) -> None:
        wait_http_ok(name=self.name, url=self.health_url, timeout=timeout,
                     is_running=self.process.is_running, exit_code=self.process.exit_code,
                     log_tail=self.process.log_tail, hint=self.hint)
        self._fingerprint = f"haproxy-{self._version}"
