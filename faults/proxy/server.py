"""FaultProxy: the links and the control API in one asyncio loop."""

from __future__ import annotations

import logging
import os
from typing import Sequence

from aiohttp import web

from .control import make_app
from .link import LinkError, LinkSpec, ProxyLink, require_loopback

log = logging.getLogger("ordeal.proxy")
READY_PREFIX = "ORDEAL-PROXY READY"


class FaultProxy:
    def __init__(self, links: Sequence[LinkSpec], control_host: str = "127.0.0.1",
                 control_port: int = 0, seed: int = 0, allowed: tuple[str, ...] = ()):
        names = [s.name for s in links]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise LinkError(f"link name(s) {dupes} given more than once; names must be unique")
        require_loopback(control_host, "control address", allowed)
        self.links = {s.name: ProxyLink(s, seed) for s in links}
        self.control_host = control_host
        self.control_port = control_port
        self.seed = seed
        self.pid = os.getpid()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        started: list[ProxyLink] = []
        try:
            for link in self.links.values():
                await link.start()
                started.append(link)
            self._runner = web.AppRunner(make_app(self), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.control_host, self.control_port)
            await site.start()
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                self.control_port = server.sockets[0].getsockname()[1]
        except BaseException:
            for link in started:
                await link.stop()
            raise

    async def stop(self) -> None:
        for link in self.links.values():
            link.reset()
            await link.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def ready_line(self) -> str:
        links = ",".join(f"{ln.name}={ln.spec.listen_host}:{ln.port}>"
                         f"{ln.spec.upstream_host}:{ln.spec.upstream_port}"
                         for ln in self.links.values())
        return f"{READY_PREFIX} control={self.control_host}:{self.control_port} links={links}"


def parse_ready_line(line: str) -> tuple[tuple[str, int], dict[str, tuple[str, int]]]:
    """The control address and each link's listen address from a READY line."""
    if not line.startswith(READY_PREFIX):
        raise ValueError(f"not a fault proxy READY line: {line!r}")
    fields = dict(part.split("=", 1) for part in line[len(READY_PREFIX):].split())
    host, port = fields["control"].rsplit(":", 1)
    links = {}
    for item in filter(None, fields.get("links", "").split(",")):
        name, addrs = item.split("=", 1)
        lhost, lport = addrs.split(">", 1)[0].rsplit(":", 1)
        links[name] = (lhost, int(lport))
    return (host, int(port)), links
