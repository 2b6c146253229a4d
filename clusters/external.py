"""A deployment Ordeal did not start (``--cluster external --target FILE``):
a Kubernetes service, a docker-compose file, a fleet of hosts.

Nothing is started or stopped but Ordeal's own fault proxy, which (with
``fault_proxy = true``, the default) listens on loopback in front of the
entrypoint as the ``client-router`` link, so the link kinds (latency,
bandwidth, resets, HTTP faults, lsn_jump) act on the user's traffic as on
an embedded cluster. The node kinds act through the target file's hooks
(faults/hook.py); a kind with neither is refused with the reason
(``unsupported``), at start and in the catalogue.

A ``[toxiproxy]`` table names a Toxiproxy server the user runs (in front of
the replicas, say) and which of its proxies carry which link: the L4 link
kinds then act there too, through its API (faults/proxy/client.py).

Every address the file names must be allowed before anything is sent:
loopback, or a network or host name given with ``--allow-target`` (a host
name only when the file names it). Checkers that need what only Ordeal's
own nodes give (served journals, process trees, the replica header) are
told so (``unavailable``) and report "unknown" with the reason.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from pathlib import Path
from typing import Any, Callable

from clusters.base import ClusterBase
from engines.registry import engine_for
from faults.base import FaultError
from faults.hook import HookFault
from faults.proxy.client import ProxyError, ToxiproxyClient
from load.client import ClientOptions
from nodes.external import ExternalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal.config import ClusterSpec, ConfigError
from ordeal.networks import SESSION_NETWORKS, Allowance, NotOurs
from ordeal.target import TargetSpec, TargetURL, ToxiproxyTarget
from ordeal.topology import Endpoint, Link

#: What an external cluster cannot give the checkers, and why
#: (invariants.base.RunContext.unavailable).
UNAVAILABLE = {
    "served_journal": "the replicas are not Ordeal's: no served journal records the request "
                      "ids each one ran (Ordeal's own replicas write one)",
    "process_tree": "the nodes' processes are not on this machine: no process tree to measure "
                    "(RSS) or to find orphans in",
    "node_attribution": "the deployment's replicas do not name themselves in an answer "
                        "(Ordeal's own add x-ordeal-node), so no request is placed on a replica",
}


def provided_by(target: TargetSpec) -> dict[str, str]:
    """Data Ordeal's own nodes give that this deployment gives its own way,
    and how: each invariant judged on it says so (``judged_with``)."""
    header = target.replica_header
    if header is None:
        return {}
    return {"node_attribution": f"the deployment's {header} response header (replica_header in "
                                f"{target.path.name}), each value placed on the replica that "
                                "claims it"}


def unavailable_on(target: TargetSpec) -> dict[str, str]:
    """What this deployment cannot give the checkers, and why."""
    given = provided_by(target)
    return {k: v for k, v in UNAVAILABLE.items() if k not in given}


def _host_port(text: str, server_host: str) -> Endpoint:
    """A Toxiproxy ``listen``/``upstream`` (``HOST:PORT``) as an endpoint; a
    wildcard listen address is the server's own host."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    local_server = server_host in ("localhost", "127.0.0.1", "::1")
    if host in ("", "0.0.0.0", "::") or (
            not local_server and host in ("localhost", "127.0.0.1", "::1")):
        host = server_host  # its own loopback is not ours
    return Endpoint(host, int(port))


def toxiproxy_links(tp: ToxiproxyTarget) -> list[Link]:
    """The target file's Toxiproxy proxies as links, each checked on the
    server now (it must exist) and its addresses read from it."""
    control = Endpoint(tp.url.host, tp.url.port, tp.url.scheme)
    try:
        SESSION_NETWORKS.require_ours(control, "--target toxiproxy.url")
    except NotOurs as e:
        raise ConfigError(str(e)) from None
    client = ToxiproxyClient(control, dict(tp.links))
    out = []
    for name, proxy in tp.links:
        try:
            got = client.link(name)
        except ProxyError as e:
            raise ConfigError(f"--target [toxiproxy] link {name} = {proxy!r}: {e}") from None
        src, dst = ("client", "router") if name == "client-router" else (
            "router", name.removeprefix("router-"))
        listen = _host_port(got["listen"], tp.url.host)
        try:  # only the listen side is reached from here (the upstream, by Toxiproxy)
            SESSION_NETWORKS.require_ours(listen, f"--target [toxiproxy] link {name} listen")
        except NotOurs as e:
            raise ConfigError(str(e)) from None
        out.append(Link(name, src, dst, listen, _host_port(got["upstream"], tp.url.host),
                        control, api="toxiproxy", proxy=proxy))
    return out


def upstream_address(host: str) -> str:
    """The address the fault proxy forwards to: the entrypoint's own, or
    the first its (allowed) host name resolves to now, which the proxy
    then forwards to alone."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"--target entrypoint host {host!r} has no IPv4 address here ({e}); "
                          "the fault proxy forwards to IPv4 or a literal address") from None
    return str(infos[0][4][0])


def _endpoint(url: TargetURL) -> Endpoint:
    return Endpoint(url.host, url.port, url.scheme)


class ExternalCluster(ClusterBase):
    backend = "external"

    def __init__(self, spec: ClusterSpec, target: TargetSpec, cluster_id: str, log_dir: Path,
                 progress: Callable[[str], None] = print):
        super().__init__(spec, cluster_id, log_dir, progress)
        self.target = target
        self.engine = target.engine
        self.engine_adapter = engine_for(target.engine, spec)
        self.sequence_jump_file = None
        self.proxy: ManagedProcess | None = None
        self._allowances: list[Allowance] = []
        entry = target.entrypoint
        default_port = entry.port == (443 if entry.scheme == "https" else 80)
        self.client_options = ClientOptions(
            headers=target.headers, api_key_env=target.api_key_env,
            verify=target.tls.verify, ca_file=target.tls.ca_file,
            server_hostname=entry.host if target.fault_proxy else None,
            # Through the proxy on loopback, the deployment still sees its own
            # name (an ingress routes by it).
            host_header=(None if not target.fault_proxy else
                         entry.host if default_port else f"{entry.host}:{entry.port}"),
            follow_redirects=False,
            **({} if target.replica_header is None else {
                "node_header": target.replica_header, "node_names": target.node_names()}))

    # -- what can run -----------------------------------------------------
    def unsupported(self, kind: str) -> str | None:
        """Why ``kind`` cannot act on this deployment, or None."""
        return self.target.unsupported(kind)

    def hooked(self, kind: str) -> list[str]:
        """The nodes a hook of ``kind`` acts on (the factory picks among them)."""
        return [n.name for n in self.nodes if self.target.hook(kind, n.name) is not None]

    def unavailable(self) -> dict[str, str]:
        return unavailable_on(self.target)

    def provided(self) -> dict[str, str]:
        return provided_by(self.target)

    def hook_fault(self, kind: str, node: Any, run_id: str, ledger: Any,
                   params: dict[str, Any]) -> Any:
        """The HookFault for ``kind`` on ``node``; FaultError naming the
        missing hook otherwise."""
        hook = self.target.hook(kind, node.name)
        if hook is None:
            raise FaultError(f"{kind} on {node.name}: the target file {self.target.path} has no "
                             f"[[hook]] for it (kind = \"{kind}\", node = \"{node.name}\" or "
                             "\"*\"); add one, or leave the kind out")
        secrets = (self.target.api_key_env,) if self.target.api_key_env else ()
        return HookFault(node, run_id, ledger, hook, self.target.ready_timeout_s, secrets,
                         hook_env=self.target.hook_env, target_file=str(self.target.path),
                         target_sha256=self.target.sha256, **params)

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "ExternalCluster":
        t = self.target
        urls = [("entrypoint", t.entrypoint)] + [(r.name, r.url) for r in t.replicas]
        for what, url in urls:
            try:
                SESSION_NETWORKS.require_ours(Endpoint(url.host, url.port),
                                              f"--target {what} {url.url}")
            except NotOurs as e:
                raise ConfigError(str(e)) from None
        self.client_options.session_headers()  # the API key's variable is set, or say so now
        tls = self.client_options.ssl_context()
        self.router = ExternalNode("router", "router", _endpoint(t.entrypoint),
                                   health_path=t.entrypoint_health_path, ssl_context=tls)
        self.nodes = [self.router] + [
            ExternalNode(r.name, "replica", _endpoint(r.url), r.health_path, r.metrics_path,
                         ssl_context=tls)
            for r in t.replicas]
        if t.fault_proxy:
            ports = free_ports(2, self.spec.host)
            control = Endpoint(self.spec.host, ports[1])
            address = upstream_address(t.entrypoint.host)
            if address != t.entrypoint.host:
                # The user allowed the name; the proxy (and the link faults'
                # checks) reach what it resolved to at start, for this run.
                self._allowances.append(SESSION_NETWORKS.allow(address))
            self.links = [Link("client-router", "client", "router",
                               Endpoint(self.spec.host, ports[0], t.entrypoint.scheme),
                               Endpoint(address, t.entrypoint.port), control)]
            loopback = ipaddress.ip_address(address).is_loopback
            self._start_fault_proxy(control, () if loopback else (
                "--allow-upstream", str(ipaddress.ip_network(address))))
        if t.toxiproxy is not None:
            self.links += toxiproxy_links(t.toxiproxy)
        t0 = time.monotonic()
        for node in self.nodes:
            node.wait_ready(t.ready_timeout_s)
            self.progress(f"{node.name} serves at {node.endpoint.url} ({node.fingerprint()})")
        hooks = sorted({h.kind for h in t.hooks})
        self.progress(f"external target {t.name}: entrypoint {t.entrypoint.url}, "
                      f"{len(t.replicas)} replica(s) named, hooks for {hooks or 'no kind'}"
                      f"{', fault proxy in front' if t.fault_proxy else ''}; ready in "
                      f"{time.monotonic() - t0:.0f}s")
        return self

    def stop(self) -> None:
        """Only the fault proxy: the deployment stays as it was found."""
        try:
            if self.proxy is not None:
                self.proxy.stop()
        finally:
            for allowance in self._allowances:
                allowance.undo()
            self._allowances.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "engine": self.engine,
            "target": self.target.describe(),
            "model": {"name": self.target.model},
            "stack": {"external": True, "chosen_by_ordeal": {
                "fault_proxy": self.target.fault_proxy}},
            "entrypoint": self.entrypoint.url if self.router else None,
            "links": [{"name": x.name, "listen": x.listen.url, "upstream": x.upstream.url}
                      for x in self.links],
            "nodes": [{"name": n.name, "role": n.role, "url": n.endpoint.url,
                       "fingerprint": n.fingerprint(), "command": None}
                      for n in self.nodes],
            "unavailable": self.unavailable(),
            "provided": self.provided(),
        }
