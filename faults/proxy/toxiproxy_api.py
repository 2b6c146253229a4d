"""Toxiproxy's HTTP API over the fault proxy's links and toxics, so that
``toxiproxy-python``, Toxiproxy's own clients and users' existing Toxiproxy
scripts drive Ordeal's fault proxy unchanged.

The two models are the same, so this module only translates; the links,
toxics and their lifecycle are the ones ``control.py``'s own routes use:

- a Toxiproxy *proxy* is one of our links, by the same name. ``listen`` and
  ``upstream`` are ``HOST:PORT``; ``enabled: false`` closes the listener (a
  new connection is refused) and drops the link's connections, as Toxiproxy
  does; its toxics stay (``ProxyLink.set_enabled``).
- a Toxiproxy *toxic* is one of our toxics. ``stream`` is our direction in
  the same words (``upstream``: client to server, ``downstream``: server to
  client), ``toxicity`` our toxicity (the same draw: once per connection),
  and the attributes are renamed (``TOXIPROXY_TYPES``). The units are the
  same: ours were taken from Toxiproxy (ms, KB/s of 1000 bytes, µs, bytes).
- a proxy made over this API gets no more reach than a ``--link``: it listens
  and forwards only on loopback or on a network the proxy was started with
  (``--allow-upstream``), checked by ``FaultProxy.check_spec``.

Routes (Toxiproxy 2.x's, with its status codes):

    GET    /version                           {"version": ...}
    GET    /proxies                           {name: proxy, ...}
    POST   /proxies                           create -> 201 proxy | 400 | 409
    POST   /populate                          [proxy, ...] -> 201 {"proxies": [...]}
    GET    /proxies/{proxy}                   proxy with its toxics | 404
    POST   /proxies/{proxy} (or PATCH)        update enabled, listen, upstream
    DELETE /proxies/{proxy}                   -> 204
    GET    /proxies/{proxy}/toxics            [toxic, ...]
    POST   /proxies/{proxy}/toxics            create -> 200 toxic | 400 | 409
    GET    /proxies/{proxy}/toxics/{toxic}    toxic | 404
    POST   /proxies/{proxy}/toxics/{toxic}    update attributes, toxicity (or PATCH)
    DELETE /proxies/{proxy}/toxics/{toxic}    -> 204
    POST   /reset                             (control.py: one reset for both faces)

What differs from Toxiproxy, on purpose:

- ``slow_close`` and ``noop`` have no toxic here: 400 naming what is
  supported. Ordeal's own types (``http_abort``, ``sse_drop``, ...) are
  accepted too, with their own attribute names.
- An unknown attribute is refused (Toxiproxy ignores it): a misspelt
  attribute must not silently leave a fault at its default.
- ``latency``'s ``jitter`` may not exceed ``latency``; ``timeout`` releases
  what it held when removed instead of dropping it (see toxics/timeout.py).
- ``listen`` must be an IP address (``localhost`` means 127.0.0.1); an empty
  one is ``127.0.0.1:0``. POST /reset answers 200 with figures, not 204.
  No /metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .link import LinkError, LinkSpec, ProxyLink
from .toxics import REGISTRY, Toxic, ToxicError, build_toxic

if TYPE_CHECKING:  # pragma: no cover
    from .server import FaultProxy

#: The Toxiproxy release whose HTTP API this follows; /version answers it
#: with "+ordeal" (semver build metadata) so that a client that checks the
#: version sees a 2.x server and a person sees whose it is.
TOXIPROXY_API_VERSION = "2.12.0"
DEFAULT_LISTEN = "127.0.0.1:0"


@dataclass(frozen=True)
class Attr:
    """One attribute: Toxiproxy's name, ours, and the unit both use."""

    toxiproxy: str
    ours: str
    unit: str


@dataclass(frozen=True)
class ToxiproxyType:
    """A Toxiproxy toxic type and the toxic of ours that does the same
    thing (same type name), with the attribute names translated."""

    name: str
    attributes: tuple[Attr, ...]

    def own_only(self) -> list[str]:
        """Our attributes Toxiproxy's type lacks (reset_peer's after_bytes):
        accepted and shown under their own names."""
        mapped = {a.ours for a in self.attributes}
        return [f.name for f in dataclasses.fields(REGISTRY[self.name].Params)
                if f.name not in mapped]

    def accepted(self) -> str:
        words = [f"{a.toxiproxy} ({a.unit})" for a in self.attributes]
        return ", ".join(words + [f"{n} (Ordeal's)" for n in self.own_only()])

    def to_ours(self, attributes: dict[str, Any]) -> dict[str, Any]:
        by_name = {a.toxiproxy: a.ours for a in self.attributes}
        own = set(self.own_only())
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if key in by_name:
                out[by_name[key]] = value
            elif key in own:
                out[key] = value
            else:
                raise ToxicError(f"toxic {self.name!r}: unknown attribute {key!r}; it takes "
                                 f"{self.accepted()}")
        return out

    def from_ours(self, params: Any) -> dict[str, Any]:
        names = {a.ours: a.toxiproxy for a in self.attributes}
        return {names.get(k, k): _plain_number(v) for k, v in dataclasses.asdict(params).items()}

    def reword(self, message: str) -> str:
        """A ToxicError of our toxic speaks of our attribute names
        (``latency_ms``); say Toxiproxy's (``latency``) to a Toxiproxy client."""
        for a in self.attributes:
            if a.ours != a.toxiproxy:
                message = message.replace(a.ours, a.toxiproxy)
        return message


TOXIPROXY_TYPES: dict[str, ToxiproxyType] = {t.name: t for t in (
    ToxiproxyType("latency", (Attr("latency", "latency_ms", "ms"),
                              Attr("jitter", "jitter_ms", "ms"))),
    ToxiproxyType("bandwidth", (Attr("rate", "rate_kbps", "KB/s"),)),
    ToxiproxyType("timeout", (Attr("timeout", "timeout_ms", "ms"),)),
    ToxiproxyType("reset_peer", (Attr("timeout", "timeout_ms", "ms"),)),
    ToxiproxyType("slicer", (Attr("average_size", "average_size", "bytes"),
                             Attr("size_variation", "size_variation", "bytes"),
                             Attr("delay", "delay_us", "µs"))),
    ToxiproxyType("limit_data", (Attr("bytes", "bytes", "bytes"),)),
)}

#: Toxiproxy types with no toxic here, and why.
NOT_HERE = {
    "slow_close": "holding a connection's close for `delay` ms has no Ordeal toxic",
    "noop": "Toxiproxy's do-nothing test toxic has no Ordeal toxic",
}


class ApiError(Exception):
    """An answer other than success: ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _plain_number(value: Any) -> Any:
    """Toxiproxy's attributes are integers: 100.0 is shown as 100."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _unsupported(ttype: Any) -> str:
    why = f" ({NOT_HERE[ttype]})" if isinstance(ttype, str) and ttype in NOT_HERE else ""
    ours = sorted(set(REGISTRY) - set(TOXIPROXY_TYPES))
    return (f"toxic type {ttype!r} is not supported by Ordeal's fault proxy{why}; "
            f"Toxiproxy types supported: {', '.join(sorted(TOXIPROXY_TYPES))}; "
            f"Ordeal's own: {', '.join(ours)}")


# -- JSON in Toxiproxy's shape --------------------------------------------------

def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def toxic_json(toxic: Toxic) -> dict[str, Any]:
    ttype = TOXIPROXY_TYPES.get(toxic.type)
    attributes = (ttype.from_ours(toxic.params) if ttype else
                  {k: _plain_number(v) for k, v in dataclasses.asdict(toxic.params).items()})
    return {"name": toxic.name, "type": toxic.type, "stream": toxic.direction,
            "toxicity": toxic.toxicity, "attributes": attributes}


def proxy_json(link: ProxyLink) -> dict[str, Any]:
    spec = link.spec
    return {"name": link.name, "listen": _address(spec.listen_host, link.port),
            "upstream": _address(spec.upstream_host, spec.upstream_port),
            "enabled": link.enabled, "toxics": [toxic_json(t) for t in link.toxics.values()]}


def build_from_toxiproxy(body: Any) -> Toxic:
    """A Toxiproxy toxic object (name, type, stream, toxicity, attributes)
    as one of our toxics, or ToxicError saying what is wrong."""
    if not isinstance(body, dict):
        raise ToxicError("a toxic is a JSON object: {name, type, stream, toxicity, attributes}")
    unknown = sorted(set(body) - {"name", "type", "stream", "toxicity", "attributes"})
    if unknown:
        raise ToxicError(f"unknown field(s) {unknown}; a toxic has name, type, stream, "
                         "toxicity, attributes")
    ttype = body.get("type")
    stream = body.get("stream") or "downstream"
    if stream not in ("upstream", "downstream"):
        raise ToxicError(f"stream {stream!r} is invalid: use 'upstream' (client to server) "
                         "or 'downstream' (server to client)")
    attributes = body.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise ToxicError(f"attributes must be a JSON object, got {attributes!r}")
    if not isinstance(ttype, str) or (ttype not in TOXIPROXY_TYPES and ttype not in REGISTRY):
        raise ToxicError(_unsupported(ttype))
    mapping = TOXIPROXY_TYPES.get(ttype)
    payload: dict[str, Any] = {"type": ttype, "direction": stream,
                               "attributes": mapping.to_ours(attributes) if mapping
                               else attributes}
    if body.get("name"):
        payload["name"] = body["name"]  # else ours: <type>_<stream>, as Toxiproxy's
    if "toxicity" in body:
        payload["toxicity"] = body["toxicity"]
    try:
        return build_toxic(payload)
    except ToxicError as e:
        raise ToxicError(mapping.reword(str(e)) if mapping else str(e)) from None


def _parse_address(value: Any, what: str, default: str | None = None) -> tuple[str, int]:
    if default is not None and value in (None, ""):
        value = default
    if not isinstance(value, str):
        raise ApiError(400, f"missing required field: {what} (a string HOST:PORT, e.g. "
                            "127.0.0.1:26379)")
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ApiError(400, f"{what} {value!r}: write HOST:PORT with an IP address or "
                            "localhost, e.g. 127.0.0.1:26379 (the fault proxy listens and "
                            "forwards only on loopback or networks it was started with)")
    return host, int(port)


def _spec_from(name: str, listen: Any, upstream: Any) -> LinkSpec:
    lhost, lport = _parse_address(listen, "listen", DEFAULT_LISTEN)
    if lhost == "localhost":  # one address, one port: not ::1 and 127.0.0.1 apart
        lhost = "127.0.0.1"
    uhost, uport = _parse_address(upstream, "upstream")
    return LinkSpec(name, lport, uhost, uport, lhost)


def _check_proxy_body(body: Any, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"bad request body: {where} takes a JSON object with name, "
                            "listen, upstream, enabled")
    # "toxics": what GET answers, sent back by clients that save a proxy whole
    # (Toxiproxy ignores it too).
    unknown = sorted(set(body) - {"name", "listen", "upstream", "enabled", "toxics"})
    if unknown:
        raise ApiError(400, f"bad request body: unknown field(s) {unknown}; a proxy has "
                            "name, listen, upstream, enabled")
    if "enabled" in body and not isinstance(body["enabled"], bool):
        raise ApiError(400, f"bad request body: enabled must be true or false, got "
                            f"{body['enabled']!r}")
    return body


# -- the routes -----------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _answers_errors(handler: Handler) -> Handler:
    """Turn ApiError, ToxicError and LinkError into Toxiproxy's error shape."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            status, message = e.status, e.message
        except (ToxicError, LinkError) as e:
            status, message = 400, str(e)
        return web.json_response({"error": message, "status": status}, status=status)

    return wrapped


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as e:
        raise ApiError(400, f"bad request body: not JSON ({e})") from None


def add_toxiproxy_routes(app: web.Application, proxy: FaultProxy) -> None:
    """Add Toxiproxy's routes to the control API's app (POST /reset is
    control.py's, the same for both)."""

    def link_of(request: web.Request) -> ProxyLink:
        name = request.match_info["proxy"]
        link = proxy.links.get(name)
        if link is None:
            raise ApiError(404, f"proxy not found: {name!r}; proxies: {sorted(proxy.links)}")
        return link

    def toxic_of(link: ProxyLink, request: web.Request) -> Toxic:
        name = request.match_info["toxic"]
        toxic = link.toxics.get(name)
        if toxic is None:
            raise ApiError(404, f"toxic not found: proxy {link.name!r} has no toxic {name!r}; "
                                f"its toxics: {sorted(link.toxics)}")
        return toxic

    async def create(spec: LinkSpec, enabled: bool) -> ProxyLink:
        """Under proxy.lock."""
        try:
            return await proxy.create_link(spec, enabled)
        except KeyError:
            raise ApiError(409, f"proxy already exists: {spec.name!r}; delete it first or "
                                "pick another name") from None
        except OSError as e:
            raise ApiError(500, f"proxy {spec.name!r} cannot listen on "
                                f"{_address(spec.listen_host, spec.listen_port)} ({e}); "
                                "pick a free port, or 0 for any") from None

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": f"{TOXIPROXY_API_VERSION}+ordeal"})

    async def proxies(request: web.Request) -> web.Response:
        return web.json_response({name: proxy_json(ln) for name, ln in proxy.links.items()})

    async def proxy_create(request: web.Request) -> web.Response:
        body = _check_proxy_body(await _json_body(request), "POST /proxies")
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "missing required field: name (a non-empty string)")
        spec = _spec_from(name, body.get("listen"), body.get("upstream"))
        async with proxy.lock:
            link = await create(spec, body.get("enabled", True))
        return web.json_response(proxy_json(link), status=201)

    async def populate(request: web.Request) -> web.Response:
        """Create the proxies given, or replace one of the same name whose
        listen or upstream differ (Toxiproxy's rule: an unchanged one keeps
        its toxics and connections). All are checked before any is made."""
        body = await _json_body(request)
        if not isinstance(body, list):
            raise ApiError(400, "bad request body: POST /populate takes a JSON array of "
                                "proxies")
        wanted: list[tuple[LinkSpec, bool]] = []
        for i, item in enumerate(body, 1):
            item = _check_proxy_body(item, f"proxy {i} of POST /populate")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ApiError(400, f"missing required field: name at proxy {i}")
            if not isinstance(item.get("upstream"), str) or not item["upstream"]:
                raise ApiError(400, f"missing required field: upstream at proxy {i}")
            spec = proxy.check_spec(_spec_from(name, item.get("listen"), item.get("upstream")))
            wanted.append((spec, item.get("enabled", True)))
        done: list[ProxyLink] = []
        async with proxy.lock:
            for spec, enabled in wanted:
                old = proxy.links.get(spec.name)
                if old is not None and _same_addresses(old, spec):
                    done.append(old)
                    continue
                if old is not None:
                    await proxy.delete_link(spec.name)
                try:
                    done.append(await create(spec, enabled))
                except ApiError as e:
                    return web.json_response({"error": e.message, "status": e.status,
                                              "proxies": [proxy_json(ln) for ln in done]},
                                             status=e.status)
        return web.json_response({"proxies": [proxy_json(ln) for ln in done]}, status=201)

    async def proxy_show(request: web.Request) -> web.Response:
        return web.json_response(proxy_json(link_of(request)))

    async def proxy_update(request: web.Request) -> web.Response:
        """Toxiproxy's update: fields left out keep their values; a new
        listen or upstream drops the connections and listens again."""
        link = link_of(request)
        body = _check_proxy_body(await _json_body(request), f"POST /proxies/{link.name}")
        current = proxy_json(link)
        spec = _spec_from(link.name, body.get("listen") or current["listen"],
                          body.get("upstream") or current["upstream"])
        enabled = body.get("enabled", link.enabled)
        async with proxy.lock:
            if proxy.links.get(link.name) is not link:
                raise ApiError(404, f"proxy not found: {link.name!r} was deleted meanwhile")
            try:
                if not _same_addresses(link, spec):
                    spec = proxy.check_spec(spec)
                    if not enabled:
                        await link.set_enabled(False)  # not listening at the new address
                    await link.reconfigure(spec)
                await link.set_enabled(enabled)
            except OSError as e:
                raise ApiError(500, f"proxy {link.name!r} cannot listen on "
                                    f"{_address(link.spec.listen_host, link.port)} ({e}); it "
                                    "is left disabled: pick a free port, or 0 for any") from None
        return web.json_response(proxy_json(link))

    async def proxy_delete(request: web.Request) -> web.Response:
        link = link_of(request)
        async with proxy.lock:
            await proxy.delete_link(link.name)
        return web.Response(status=204)

    async def toxics(request: web.Request) -> web.Response:
        return web.json_response([toxic_json(t) for t in link_of(request).toxics.values()])

    async def toxic_create(request: web.Request) -> web.Response:
        link = link_of(request)
        toxic = build_from_toxiproxy(await _json_body(request))
        try:
            link.add(toxic)
        except KeyError:
            raise ApiError(409, f"toxic already exists: proxy {link.name!r} has a toxic named "
                                f"{toxic.name!r}; remove it first or pick another name") from None
        return web.json_response(toxic_json(toxic))

    async def toxic_show(request: web.Request) -> web.Response:
        link = link_of(request)
        return web.json_response(toxic_json(toxic_of(link, request)))

    async def toxic_update(request: web.Request) -> web.Response:
        """Toxiproxy's update: the attributes given replace those of the
        same name, the others and (unless given) the toxicity are kept."""
        link = link_of(request)
        old = toxic_of(link, request)
        body = await _json_body(request)
        if not isinstance(body, dict) or set(body) - {"attributes", "toxicity"}:
            raise ApiError(400, "bad request body: a toxic update takes a JSON object with "
                                "attributes and toxicity only")
        changes = body.get("attributes") or {}
        if not isinstance(changes, dict):
            raise ApiError(400, f"attributes must be a JSON object, got {changes!r}")
        merged = toxic_json(old)
        merged["attributes"] = {**merged["attributes"], **changes}
        merged["toxicity"] = body.get("toxicity", old.toxicity)
        new = build_from_toxiproxy(merged)
        if link.toxics.get(old.name) is not old:  # removed while the body was read
            raise ApiError(404, f"toxic not found: {old.name!r} was removed meanwhile")
        link.replace(new)
        return web.json_response(toxic_json(new))

    async def toxic_delete(request: web.Request) -> web.Response:
        link = link_of(request)
        toxic = toxic_of(link, request)
        link.remove(toxic.name)
        return web.Response(status=204)

    routes = [
        ("GET", "/version", version),
        ("GET", "/proxies", proxies),
        ("POST", "/proxies", proxy_create),
        ("POST", "/populate", populate),
        ("GET", "/proxies/{proxy}", proxy_show),
        ("POST", "/proxies/{proxy}", proxy_update),
        ("PATCH", "/proxies/{proxy}", proxy_update),
        ("DELETE", "/proxies/{proxy}", proxy_delete),
        ("GET", "/proxies/{proxy}/toxics", toxics),
        ("POST", "/proxies/{proxy}/toxics", toxic_create),
        ("GET", "/proxies/{proxy}/toxics/{toxic}", toxic_show),
        ("POST", "/proxies/{proxy}/toxics/{toxic}", toxic_update),
        ("PATCH", "/proxies/{proxy}/toxics/{toxic}", toxic_update),
        ("DELETE", "/proxies/{proxy}/toxics/{toxic}", toxic_delete),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, _answers_errors(handler))


def _same_addresses(link: ProxyLink, spec: LinkSpec) -> bool:
    """Toxiproxy's ``Differs``, negated: the same listen (as bound: port 0
    differs from the port it got) and the same upstream."""
    return ((link.spec.listen_host, link.port, link.spec.upstream_host, link.spec.upstream_port)
            == (spec.listen_host, spec.listen_port, spec.upstream_host, spec.upstream_port))
