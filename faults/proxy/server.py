"""FaultProxy: the links and the control API in one asyncio loop.

The links' lifecycle (create, enable/disable, move, delete, reset) lives
here, once, for both faces of the control API (``control.py``: ours, and
``toxiproxy_api.py``: Toxiproxy's)."""

from __future__ import annotations

import asyncio
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
        #: Networks besides loopback a link may listen on and forward to
        #: (``--allow-upstream``): the same rule for links made over the API.
        self.allowed = tuple(allowed)
        self.pid = os.getpid()
        self._runner: web.AppRunner | None = None
        # Serialises changes to the set of links and their listeners: each
        # change awaits (listen, close), and two at once could interleave.
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        started: list[ProxyLink] = []
        try:
            for link in self.links.values():
                await link.set_enabled(True)
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

    # -- the links' lifecycle (callers hold ``self.lock``) ----------------------

    def check_spec(self, spec: LinkSpec) -> LinkSpec:
        """``spec`` with this proxy's allowed networks, checked as a
        ``--link`` is (loopback, or an ``--allow-upstream`` network): a link
        made over the API gets no wider reach than one on the command line."""
        spec = LinkSpec(spec.name, spec.listen_port, spec.upstream_host, spec.upstream_port,
                        spec.listen_host, self.allowed)
        spec.check()
        return spec

    async def create_link(self, spec: LinkSpec, enabled: bool = True) -> ProxyLink:
        """A new link, listening when ``enabled``. KeyError: the name is
        taken; LinkError: a bad spec; OSError: cannot listen there."""
        spec = self.check_spec(spec)
        if spec.name in self.links:
            raise KeyError(spec.name)
        link = ProxyLink(spec, self.seed)
        await link.set_enabled(enabled)
        self.links[spec.name] = link
        log.info("link %s: created (%s:%d > %s:%d, enabled %s)", spec.name, spec.listen_host,
                 link.port, spec.upstream_host, spec.upstream_port, enabled)
        return link

    async def delete_link(self, name: str) -> ProxyLink | None:
        """Stop and forget a link (its toxics removed first); None if none."""
        link = self.links.pop(name, None)
        if link is not None:
            link.reset()
            await link.stop()
            link.enabled = False
            log.info("link %s: deleted", name)
        return link

    async def reset(self) -> tuple[int, list[str], list[str]]:
        """Toxiproxy's reset: remove every toxic and enable every link.
        Returns (toxics removed, links enabled again, errors: links that
        could not listen again, each with why)."""
        removed = sum(ln.reset() for ln in self.links.values())
        enabled: list[str] = []
        errors: list[str] = []
        for link in self.links.values():
            if link.enabled:
                continue
            try:
                await link.set_enabled(True)
                enabled.append(link.name)
            except OSError as e:
                errors.append(f"link {link.name!r} cannot listen on "
                              f"{link.spec.listen_host}:{link.port} again ({e})")
        return removed, enabled, errors

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
