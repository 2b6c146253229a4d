"""ASGI middleware loaded into each vLLM replica with ``--middleware``.

Two jobs, both from inside the replica, where the truth is:

1. It adds ``x-ordeal-node: <name>`` to every response, so a request that
   went through the router is recorded with the replica that served it. The
   router forwards upstream headers unchanged (seen with vllm-router 0.1.17).
2. It keeps a *served journal*: for each request that carried an
   ``x-request-id``, a ``begin`` line when it arrives and an ``end`` line
   when the response ends, saying whether the replica sent all of it. The
   client cannot see a router retry; the journals can, and
   ``no_duplicate_execution`` reads them. The begin lines tell
   ``health_truthful`` that a replica holds work even when its engine (and
   with it the engine's own gauges) is frozen. The monitor copies new lines
   into the history.
3. It holds the failure zoo's ``memory_leak`` and
   ``html_5xx_hidden_by_retries`` when one is planted (ordeal/planted.py: a
   file beside the journal, looked at once a second).

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer and
slow streaming responses. Lines are written with one ``os.write`` on an
O_APPEND descriptor, so they never interleave, and a line is tiny.
"""

from __future__ import annotations

import json
import os
import time
from http import HTTPStatus

from ordeal.journal import journal_path
from ordeal.planted import error_path, leak_path, read_error, read_leak

#: This module and what it imports of Ordeal, relative to the repository
#: root: all that enters a container that runs its image's own vLLM
#: (clusters/docker.py copies them beside each other, nothing else).
FILES = ("engines/vllm/node_header.py", "ordeal/journal.py", "ordeal/planted.py")


class NodeHeaderMiddleware:
    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app
        self.name = os.environ.get("ORDEAL_NODE", "unknown")
        self.value = self.name.encode()
        log_dir = os.environ.get("ORDEAL_LOG_DIR")
        self.fd: int | None = None
        self.leak_file = leak_path(log_dir, self.name) if log_dir else None
        self.error_file = error_path(log_dir, self.name) if log_dir else None
        self.leak_per_request = 0
        self.error_status = 0
        self.planted_checked = 0.0
        self.leaked: list[bytearray] = []
        if log_dir:
            self.fd = os.open(journal_path(log_dir, self.name),
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _read_planted(self) -> None:
        """What the zoo planted, looked at once a second."""
        now = time.monotonic()
        if now - self.planted_checked >= 1.0:
            self.planted_checked = now
            if self.leak_file is not None:
                self.leak_per_request = read_leak(self.leak_file)
            if self.error_file is not None:
                self.error_status = read_error(self.error_file)

    def _leak(self) -> None:
        """The planted leak (faults/zoo/memory_leak.py): the bytes the file
        names, every page written (so they count in RSS), kept per request;
        all freed once the file is gone."""
        if self.leak_per_request:
            self.leaked.append(bytearray(b"\x01") * self.leak_per_request)
        elif self.leaked:
            self.leaked.clear()

    def _journal(self, **fields: object) -> None:
        if self.fd is None:
            return
        line = json.dumps({**fields, "node": self.name, "t": round(time.time(), 3)})
        os.write(self.fd, line.encode() + b"\n")

    async def _error_page(self, receive, send) -> None:  # type: ignore[no-untyped-def]
        """The planted server error (faults/zoo/html_5xx_hidden_by_retries.py):
        the request read to its end and answered with the status and an
        HTML page, as a proxy or server in front of a broken engine does."""
        while True:
            message = await receive()
            if message.get("type") != "http.request" or not message.get("more_body"):
                break
        status = self.error_status
        title = f"{status} {HTTPStatus(status).phrase}"
        body = (f"<html><head><title>{title}</title></head><body><center><h1>{title}</h1>"
                "</center></body></html>\n").encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/html"),
                                (b"content-length", str(len(body)).encode()),
                                (b"x-ordeal-node", self.value)]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        self._read_planted()
        self._leak()
        rid = None
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:200]
                break
        state = {"status": None, "complete": False}
        if rid is not None:
            self._journal(rid=rid, phase="begin")
        if (self.error_status and scope.get("method") == "POST"
                and str(scope.get("path", "")).startswith("/v1/")):
            await self._error_page(receive, send)
            if rid is not None:
                self._journal(rid=rid, phase="end", status=self.error_status, complete=True)
            return None

        async def send_with_header(message):  # type: ignore[no-untyped-def]
            if message.get("type") == "http.response.start":
                state["status"] = message.get("status")
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + [
                    (b"x-ordeal-node", self.value)]
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                state["complete"] = True

        try:
            return await self.app(scope, receive, send_with_header)
        finally:
            if rid is not None:
                self._journal(rid=rid, phase="end", status=state["status"],
                              complete=bool(state["complete"]))
