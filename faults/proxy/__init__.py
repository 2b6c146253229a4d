"""Ordeal's fault proxy: an asyncio TCP proxy with Toxiproxy-like L4 toxics
and L7 toxics that understand HTTP/1.1 responses and SSE streams.

Usable alone: ``python -m faults.proxy --help``; control it over HTTP/JSON
(``control.py``) or with ``ProxyClient`` (``client.py``, stdlib only).
"""

from .client import LinkNotFound, ProxyClient, ProxyError, ProxyUnreachable

__all__ = ["LinkNotFound", "ProxyClient", "ProxyError", "ProxyUnreachable"]
