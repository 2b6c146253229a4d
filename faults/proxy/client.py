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
