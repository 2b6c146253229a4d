"""One proxied link: a listener, its upstream, its toxics and counters.

The toxic lists are kept split by layer and direction and rebuilt on every
change, so the per-chunk question "does any toxic apply here?" is one
attribute read (the fast path)."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from dataclasses import dataclass

from . import sockets
from .connection import Connection
from .toxics import L7Toxic, Toxic
from .toxics.http_abort import HttpAbort

log = logging.getLogger("ordeal.proxy")
CONNECT_TIMEOUT_S = 10.0


class LinkError(ValueError):
    """A link that cannot be proxied as asked (bad spec, non-loopback upstream)."""


@dataclass(frozen=True)
class LinkSpec:
    name: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    listen_host: str = "127.0.0.1"
    #: Networks besides loopback the link may listen on and forward to: only
    #: ones the suite created (a Docker network of the run), named by it.
    allowed: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, listen_host: str = "127.0.0.1",
              allowed: tuple[str, ...] = ()) -> "LinkSpec":
        """``NAME=LISTENPORT:UPSTREAMHOST:UPSTREAMPORT`` (listen port 0: any free one)."""
        name, sep, rest = text.partition("=")
        parts = rest.rsplit(":", 2) if sep else []
        if not name or len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            raise LinkError(f"--link {text!r}: write NAME=LISTENPORT:UPSTREAMHOST:UPSTREAMPORT, "
                            "e.g. router-replica-0=18101:127.0.0.1:18001")
        spec = cls(name, int(parts[0]), parts[1].strip("[]"), int(parts[2]), listen_host,
                   tuple(allowed))
        spec.check()
        return spec

    def check(self) -> None:
        if "/" in self.name or not self.name.strip():
            raise LinkError(f"link name {self.name!r}: use a non-empty name without '/'")
        for what, port in (("listen port", self.listen_port), ("upstream port",
                                                                  self.upstream_port)):
            if not 0 <= port <= 65535:
                raise LinkError(f"link {self.name}: {what} {port} is out of range 0..65535")
        if self.upstream_port == 0:
            raise LinkError(f"link {self.name}: the upstream port must not be 0")
        require_loopback(self.upstream_host, f"link {self.name}: upstream", self.allowed)
        require_loopback(self.listen_host, f"link {self.name}: listen address", self.allowed)


def require_loopback(host: str, what: str, allowed: tuple[str, ...] = ()) -> None:
    """The proxy only ever connects to this machine: loopback, or a network
    the suite created and names in ``allowed`` (``--allow-upstream``)."""
    if host == "localhost":
        return
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise LinkError(f"{what} {host!r} is not an IP address; the fault proxy only forwards "
                        "to loopback (127.0.0.0/8, ::1, localhost)") from None
    try:
        nets = [ipaddress.ip_network(c, strict=False) for c in allowed]
    except ValueError as e:
        raise LinkError(f"--allow-upstream {allowed}: not a network ({e})") from None
    if not addr.is_loopback and not any(addr in n for n in nets):
        raise LinkError(f"{what} {host} is not a loopback address"
                        + (f" nor in {', '.join(allowed)}" if allowed else "")
                        + "; the fault proxy only forwards to loopback (127.0.0.0/8, ::1) and "
                        "to networks the suite created (--allow-upstream) so that no traffic "
                        "leaves the machine")


class ProxyLink:
    """A link's listener, toxics and counters. ``enabled`` is Toxiproxy's
    "proxy enabled": a disabled link does not listen (a connection is
    refused) and has dropped the connections it had; its toxics stay."""

    def __init__(self, spec: LinkSpec, seed: int):
        self.spec = spec
        self.name = spec.name
        self.seed = seed
        self.enabled = False  # listening; set by set_enabled (FaultProxy.start enables)
        self.toxics: dict[str, Toxic] = {}
        self.l4: dict[str, list[Toxic]] = {"upstream": [], "downstream": []}
        self.l7: list[L7Toxic] = []
        self._has = {"upstream": False, "downstream": False}
        self.connections = 0
        self.active = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.bytes_spliced = 0  # of bytes_up + bytes_down, those the kernel moved (the fast path)
        self.connect_errors = 0
        self.l7_framing_lost = 0  # exchanges whose framing the response stage lost
        self.server: asyncio.Task[None] | None = None  # the accept loop, while listening
        self.port = spec.listen_port
        self._conns: set[Connection] = set()
        # Bumped on every stop: a connection accepted before a stop whose
        # upstream connect finishes after it is closed, not proxied.
        self._generation = 0

    # -- toxics ---------------------------------------------------------------

    def has_toxics(self, direction: str) -> bool:
        return self._has[direction]

    def add(self, toxic: Toxic) -> None:
        if toxic.name in self.toxics:
            raise KeyError(toxic.name)
        self.toxics[toxic.name] = toxic
        self._rebuild()
        log.info("link %s: added toxic %s", self.name, toxic.describe())

    def remove(self, name: str) -> Toxic | None:
        """The removed toxic (its counters final), None if there was none."""
        toxic = self.toxics.pop(name, None)
        if toxic is None:
            return None
        toxic.removed.set()  # releases whatever it holds
        self._rebuild()
        log.info("link %s: removed toxic %s", self.name, name)
        return toxic

    def replace(self, toxic: Toxic) -> Toxic:
        """Swap the toxic of the same name for ``toxic`` (Toxiproxy's toxic
        update); the old one is removed as by ``remove`` (what it held is
        released), the new one keeps its place in the order. Returns the old."""
        old = self.toxics[toxic.name]
        self.toxics[toxic.name] = toxic
        old.removed.set()
        self._rebuild()
        log.info("link %s: replaced toxic %s", self.name, toxic.describe())
        return old

    def reset(self) -> int:
        names = list(self.toxics)
        for name in names:
            self.remove(name)
        return len(names)

    def _rebuild(self) -> None:
        ts = list(self.toxics.values())
        self.l4 = {d: [t for t in ts if t.layer == "l4" and t.direction == d]
                   for d in ("upstream", "downstream")}
        self.l7 = [t for t in ts if isinstance(t, L7Toxic)]
        aborts = any(isinstance(t, HttpAbort) for t in self.l7)
        self._has = {"upstream": bool(self.l4["upstream"]) or aborts,
                     "downstream": bool(self.l4["downstream"]) or any(
                         not isinstance(t, HttpAbort) for t in self.l7)}

    def describe(self) -> dict:
        return {"name": self.name,
                "listen": f"{self.spec.listen_host}:{self.port}",
                "enabled": self.enabled,
                "upstream": f"{self.spec.upstream_host}:{self.spec.upstream_port}",
                "toxics": [t.describe() for t in self.toxics.values()],
                "counters": {"connections": self.connections, "active": self.active,
                             "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                             "bytes_spliced": self.bytes_spliced,
                             "connect_errors": self.connect_errors,
                             "l7_framing_lost": self.l7_framing_lost}}

    # -- serving --------------------------------------------------------------

    async def start(self) -> None:
        """Listen. On ``self.port``: the port a listen port of 0 got the
        first time, so a link enabled again comes back where it was (as
        Toxiproxy's proxy does)."""
        if self.server is not None:
            return
        listener = sockets.listen(self.spec.listen_host, self.port)
        self.port = listener.getsockname()[1]
        self.server = asyncio.create_task(self._serve(listener))

    async def _serve(self, listener) -> None:  # type: ignore[no-untyped-def]
        """Accept until cancelled (stop), then close the listening socket."""
        loop = asyncio.get_running_loop()
        handlers: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    client, _ = await loop.sock_accept(listener)
                except (ConnectionAbortedError, ConnectionResetError):
                    continue  # the client gave up before we took it
                except OSError as e:  # out of descriptors, say: keep listening
                    log.warning("link %s: accept failed (%s)", self.name, e)
                    await asyncio.sleep(0.1)
                    continue
                task = asyncio.create_task(self._accept(client))
                handlers.add(task)
                task.add_done_callback(handlers.discard)
        finally:
            listener.close()

    async def stop(self) -> None:
        """Stop listening and close every connection (FIN both ways)."""
        self._generation += 1
        server, self.server = self.server, None
        if server is not None:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        for conn in list(self._conns):
            conn.close("proxy stopping")

    async def set_enabled(self, enabled: bool) -> None:
        """Enable (listen) or disable (stop listening, drop the connections).
        OSError when the listen address is taken meanwhile: left disabled."""
        if enabled and not self.enabled:
            await self.start()
        elif not enabled and self.enabled:
            await self.stop()
        self.enabled = enabled

    async def reconfigure(self, spec: LinkSpec) -> None:
        """New listen and upstream addresses (Toxiproxy's proxy update):
        the connections are dropped and, when enabled, the link listens again
        at the new address. ``spec`` is checked by the caller. On OSError the
        link keeps the new spec and is left disabled."""
        was_enabled = self.enabled
        await self.set_enabled(False)
        self.spec = dataclasses.replace(spec, name=self.name)
        self.port = spec.listen_port
        if was_enabled:
            await self.set_enabled(True)

    async def _accept(self, client_sock) -> None:  # type: ignore[no-untyped-def]
        self.connections += 1
        conn_id = self.connections
        generation = self._generation
        spec = self.spec
        client = sockets.Side(client_sock)
        try:
            up_sock = await asyncio.wait_for(
                sockets.connect(spec.upstream_host, spec.upstream_port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            # Like a dead host behind the proxy: the client sees its connection closed.
            self.connect_errors += 1
            log.info("link %s conn %d: upstream %s:%d unreachable (%s)", self.name, conn_id,
                     spec.upstream_host, spec.upstream_port, e)
            client.close()
            return
        upstream = sockets.Side(up_sock)
        if generation != self._generation:  # disabled or moved while connecting
            upstream.close()
            client.close()
            return
        conn = Connection(self, conn_id, self.seed, client, upstream)
        self._conns.add(conn)
        self.active += 1
        try:
            await conn.run()
        finally:
            self.active -= 1
            self._conns.discard(conn)
