"""A small synchronous client of the fault proxy's control API (stdlib
only, every call with a timeout), for faults and tests.

Errors are typed so callers can tell "the proxy is not there" (nothing to
heal; refuse to inject) from "the proxy said no" (bad toxic, unknown link).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from ordeal.topology import Endpoint

from .toxiproxy_api import TOXIPROXY_TYPES


class ProxyError(RuntimeError):
    """The proxy answered with an error; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ProxyUnreachable(ProxyError):
    """Nothing answers at the control address (refused, or timed out)."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused  # True: nothing listens there (a dead proxy)


class LinkNotFound(ProxyError):
    pass


class ProxyClient:
    def __init__(self, control: Endpoint | str, timeout: float = 5.0):
        self.base = control.url if isinstance(control, Endpoint) else control.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("error") or raw.decode(errors="replace")
            except ValueError:
                message = raw.decode(errors="replace")
            cls = LinkNotFound if e.code == 404 and "no link" in message else ProxyError
            raise cls(f"fault proxy at {self.base}: {method} {path} -> HTTP {e.code}: "
                      f"{message}", e.code) from None
        except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            refused = isinstance(reason, ConnectionRefusedError)
            raise ProxyUnreachable(
                f"fault proxy at {self.base} is unreachable ({reason}); "
                + ("nothing listens there: is the proxy running?" if refused else
                   f"no answer within {self.timeout}s: is it overloaded or stopped?"),
                refused) from None

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")[1]

    def links(self) -> list[dict[str, Any]]:
        return self._call("GET", "/links")[1]["links"]

    def link(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/links/{name}")[1]

    def toxics(self, link: str) -> list[dict[str, Any]]:
        return self.link(link)["toxics"]

    def add_toxic(self, link: str, type: str, name: str | None = None,
                  direction: str = "downstream", toxicity: float = 1.0,
                  attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"type": type, "direction": direction, "toxicity": toxicity,
                "attributes": attributes or {}}
        if name:
            body["name"] = name
        return self._call("POST", f"/links/{link}/toxics", body)[1]

    def remove_toxic(self, link: str, name: str) -> bool:
        """True if removed; False if it was already gone (404)."""
        return self.take_toxic(link, name) is not None

    def take_toxic(self, link: str, name: str) -> dict[str, Any] | None:
        """Remove a toxic; its description as it was removed (an L7 toxic's
        with its final ``counters``), or None if it was already gone (404)."""
        try:
            return self._call("DELETE", f"/links/{link}/toxics/{name}")[1] or {}
        except ProxyError as e:
            if e.status == 404:
                return None
            raise

    def reset(self) -> int:
        return self._call("POST", "/reset")[1]["removed"]


class ToxiproxyClient(ProxyClient):
    """The same calls over Toxiproxy's HTTP API, for link faults that act
    through a Toxiproxy server the user runs in front of their deployment
    (a target file's ``[toxiproxy]``), or through Ordeal's proxy's own
    Toxiproxy face. Links are the user's proxies, by ``proxies`` (link name
    -> proxy name); toxics go in with Toxiproxy's type and attribute names
    (``toxiproxy_api.TOXIPROXY_TYPES``, the one table of the translation).
    Toxiproxy counts nothing a toxic did, so a link here has no counters."""

    def __init__(self, control: Endpoint | str, proxies: dict[str, str] | None = None,
                 timeout: float = 5.0):
        super().__init__(control, timeout)
        self.proxies = dict(proxies or {})

    def _proxy(self, link: str) -> str:
        return self.proxies.get(link, link)

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return super()._call(method, path, body)
        except ProxyUnreachable as e:
            raise ProxyUnreachable(str(e).replace("fault proxy", "Toxiproxy server", 1),
                                   e.refused) from None
        except ProxyError as e:
            message = str(e).replace("fault proxy", "Toxiproxy server", 1)
            cls = LinkNotFound if e.status == 404 and "/toxics/" not in message else ProxyError
            raise cls(message, e.status) from None

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/version")[1] or {}

    def links(self) -> list[dict[str, Any]]:
        by_proxy = {v: k for k, v in self.proxies.items()}
        got = self._call("GET", "/proxies")[1] or {}
        return [{**p, "name": by_proxy.get(name, name)} for name, p in got.items()]

    def link(self, name: str) -> dict[str, Any]:
        return {**self._call("GET", f"/proxies/{self._proxy(name)}")[1], "name": name}

    def add_toxic(self, link: str, type: str, name: str | None = None,
                  direction: str = "downstream", toxicity: float = 1.0,
                  attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"type": type, "stream": direction, "toxicity": toxicity,
                "attributes": toxiproxy_attributes(type, attributes or {})}
        if name:
            body["name"] = name
        return self._call("POST", f"/proxies/{self._proxy(link)}/toxics", body)[1]

    def take_toxic(self, link: str, name: str) -> dict[str, Any] | None:
        path = f"/proxies/{self._proxy(link)}/toxics/{name}"
        try:
            toxic = self._call("GET", path)[1] or {}
            self._call("DELETE", path)
            return toxic
        except ProxyError as e:
            if e.status == 404:
                return None
            raise

    def reset(self) -> int:
        self._call("POST", "/reset")
        return -1  # Toxiproxy does not say how many


def toxiproxy_attributes(type: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """Our attribute names for ``type`` as Toxiproxy's; ``ProxyError`` for
    a type Toxiproxy does not have (Ordeal's L7 toxics)."""
    ttype = TOXIPROXY_TYPES.get(type)
    if ttype is None:
        raise ProxyError(f"Toxiproxy has no {type!r} toxic (it has "
                         f"{', '.join(sorted(TOXIPROXY_TYPES))}); this fault needs Ordeal's "
                         "own fault proxy")
    names = {a.ours: a.toxiproxy for a in ttype.attributes}
    return {names.get(k, k): v for k, v in attributes.items()}
