"""The control API, HTTP/JSON, in two faces on one port over one set of
links and toxics.

Ours (what the suite and ``ProxyClient`` use):

    GET    /health                      {"status": "ok", "links": n, "seed": s}
    GET    /links                       {"links": [link, ...]}
    GET    /links/{name}                link (enabled, toxics and counters)
    POST   /links/{name}/toxics         toxic spec -> 201 toxic | 400 | 404 | 409
    DELETE /links/{name}/toxics/{toxic} -> 200 toxic (final counters) | 404
    POST   /reset                       remove every toxic and enable every link
                                        -> 200 {"removed": n, "enabled": [names]}

Toxiproxy's (``toxiproxy_api.py``), so ``toxiproxy-python`` and existing
Toxiproxy scripts drive the same proxy: GET /version, /proxies (list,
create), /proxies/{proxy} (show, update, delete), /proxies/{proxy}/toxics
and /proxies/{proxy}/toxics/{toxic}, POST /populate. A Toxiproxy proxy is
one of our links (same name), a Toxiproxy toxic one of our toxics, and
POST /reset is the same call (Toxiproxy's reset answers 204; clients accept
any 2xx, so ours answers 200 with the figures).

Every error is ``{"error": "..."}`` with a message that says what to do
(Toxiproxy's routes add ``"status"``, as Toxiproxy does). A request whose
User-Agent is a browser's (``Mozilla/...``) is refused with 403, as
Toxiproxy does: a web page must not be able to drive the proxy through the
user's browser.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import web

from .toxics import ToxicError, build_toxic
from .toxiproxy_api import add_toxiproxy_routes

if TYPE_CHECKING:  # pragma: no cover
    from .server import FaultProxy


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def make_app(proxy: "FaultProxy") -> web.Application:
    def link_or_404(request: web.Request):
        name = request.match_info["link"]
        link = proxy.links.get(name)
        if link is None:
            raise web.HTTPNotFound(
                text=json.dumps({"error": f"no link {name!r}; links: {sorted(proxy.links)}"}),
                content_type="application/json")
        return link

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "links": len(proxy.links),
                                  "seed": proxy.seed, "pid": proxy.pid})

    async def links(request: web.Request) -> web.Response:
        return web.json_response({"links": [ln.describe() for ln in proxy.links.values()]})

    async def one_link(request: web.Request) -> web.Response:
        return web.json_response(link_or_404(request).describe())

    async def add_toxic(request: web.Request) -> web.Response:
        link = link_or_404(request)
        try:
            payload = await request.json()
        except ValueError as e:
            return _error(400, f"the body is not JSON ({e}); send a toxic object")
        try:
            toxic = build_toxic(payload)
        except ToxicError as e:
            return _error(400, str(e))
        try:
            link.add(toxic)
        except KeyError:
            return _error(409, f"link {link.name!r} already has a toxic named {toxic.name!r}; "
                          "remove it first or pick another name")
        return web.json_response(toxic.describe(), status=201)

    async def remove_toxic(request: web.Request) -> web.Response:
        link = link_or_404(request)
        name = request.match_info["toxic"]
        toxic = link.remove(name)
        if toxic is None:
            return _error(404, f"link {link.name!r} has no toxic {name!r}")
        return web.json_response(toxic.describe())

    async def reset(request: web.Request) -> web.Response:
        async with proxy.lock:
            removed, enabled, errors = await proxy.reset()
        if errors:
            return web.json_response({"error": "; ".join(errors) + "; their toxics were "
                                      "removed; free those ports or re-create the proxies",
                                      "status": 500, "removed": removed, "enabled": enabled},
                                     status=500)
        return web.json_response({"removed": removed, "enabled": enabled})

    app = web.Application(middlewares=[refuse_browsers])
    app.router.add_get("/health", health)
    app.router.add_get("/links", links)
    app.router.add_get("/links/{link}", one_link)
    app.router.add_post("/links/{link}/toxics", add_toxic)
    app.router.add_delete("/links/{link}/toxics/{toxic}", remove_toxic)
    app.router.add_post("/reset", reset)
    add_toxiproxy_routes(app, proxy)
    return app


@web.middleware
async def refuse_browsers(request: web.Request, handler):
    """Toxiproxy's stopBrowsersMiddleware: a page in the user's browser can
    send a cross-site POST to a loopback port; a browser's User-Agent is
    refused so that no web page can add toxics or open listeners."""
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return web.json_response({"error": "requests from a browser are refused (the "
                                  "control API is for tools and scripts)", "status": 403},
                                 status=403)
    return await handler(request)
