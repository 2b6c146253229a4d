"""What the five link faults share: add toxics to a link of the fault
proxy, remove them on heal, and heal from the ledger alone after a crash.

Each fault picks its toxic names in ``__init__`` (``ordeal-<kind>-<hex>``)
so that the ledger entry, written before anything is added, already says
exactly what to remove: ``{"control": URL, "link": NAME, "toxics": [...]}``;
the live heal and heal-all both remove them from that (``undo``).
Preflight refuses, before the ledger or the proxy is touched, a link whose
addresses are not ours, a proxy that does not answer, a link the proxy does
not have, and parameters the proxy would reject.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ordeal.topology import Link

from . import safety
from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .proxy.client import (
    LinkNotFound,
    ProxyClient,
    ProxyError,
    ProxyUnreachable,
    ToxiproxyClient,
    toxiproxy_attributes,
)
from .proxy.toxics import ToxicError, build_toxic

BOTH = ("upstream", "downstream")


@dataclass(frozen=True)
class ToxicSpec:
    """One toxic to add: the control API's payload, minus its name."""

    type: str
    direction: str = "downstream"
    attributes: dict[str, Any] = field(default_factory=dict)
    toxicity: float = 1.0


def directions(direction: str, kind: str) -> tuple[str, ...]:
    if direction == "both":
        return BOTH
    if direction not in BOTH:
        raise FaultError(f"{kind}: direction {direction!r}: use 'upstream' (client to server), "
                         "'downstream' (server to client) or 'both'")
    return (direction,)


class LinkFault(Fault):
    """Base of the link faults. Subclasses build ``self.specs`` in __init__."""

    kind: ClassVar[str] = ""

    def __init__(self, link: Link, run_id: str, ledger: Ledger, specs: list[ToxicSpec],
                 timeout_s: float = 5.0):
        super().__init__(link.name, run_id, ledger)
        self.link = link
        self.specs = specs
        tag = uuid.uuid4().hex[:10]
        self.toxic_names = [f"ordeal-{self.kind}-{tag}-{i}" for i in range(len(specs))]
        self.client = control_client(link.control.url, link.api, link.name, link.proxy,
                                     timeout_s)

    # -- refusing early -----------------------------------------------------

    def _preflight(self) -> None:
        # Ordeal's proxy connects to the upstream; a user's Toxiproxy does, so
        # only its listen and control addresses are reached from here.
        reached = (("listen", self.link.listen), ("control", self.link.control)) + (
            (("upstream", self.link.upstream),) if self.link.api == "ordeal" else ())
        for what, ep in reached:
            try:
                safety.require_ours(ep, self.kind)
            except FaultError as e:
                raise FaultError(f"{e} (link {self.link.name}, {what} address)") from None
        for spec, name in zip(self.specs, self.toxic_names):
            try:
                build_toxic({"name": name, "type": spec.type, "direction": spec.direction,
                             "toxicity": spec.toxicity, "attributes": spec.attributes})
            except ToxicError as e:
                raise FaultError(f"{self.kind} on {self.link.name}: {e}") from None
            if self.link.api == "toxiproxy":
                try:
                    toxiproxy_attributes(spec.type, spec.attributes)
                except ProxyError as e:
                    raise FaultError(f"{self.kind} on {self.link.name} (a Toxiproxy link): "
                                     f"{e}") from None
        try:
            self.client.link(self.link.name)
        except LinkNotFound:
            names = self._known_links()
            raise FaultError(f"{self.kind}: the fault proxy at {self.link.control.url} has no "
                             f"link {self.link.name!r} (it has {names}); check the cluster's "
                             "links or the proxy's --link options") from None
        except ProxyUnreachable as e:
            raise FaultError(f"{self.kind} on {self.link.name}: {e}") from None
        except ProxyError as e:
            raise FaultError(f"{self.kind} on {self.link.name}: {e}") from None

    def _known_links(self) -> list[str]:
        try:
            return [ln["name"] for ln in self.client.links()]
        except ProxyError:
            return []

    # -- acting and undoing ---------------------------------------------------

    def _inverse(self) -> dict[str, Any]:
        return {"action": "remove_toxics", "control": self.link.control.url,
                "link": self.link.name, "toxics": list(self.toxic_names),
                "timeout_s": self.client.timeout, "api": self.link.api,
                "proxy": self.link.proxy}

    def _act(self) -> dict[str, Any]:
        added = []
        for spec, name in zip(self.specs, self.toxic_names):
            self.client.add_toxic(self.link.name, spec.type, name=name,
                                  direction=spec.direction, toxicity=spec.toxicity,
                                  attributes=spec.attributes)
            added.append({"toxic": name, "type": spec.type, "direction": spec.direction,
                          "toxicity": spec.toxicity, **spec.attributes})
        return {"link": self.link.name, "toxics": added}

    def observe(self) -> Effect | None:
        """What the proxy says each of this fault's toxics acted on (chunks
        delayed or throttled, connections reset, responses aborted, events
        changed): a toxic on a link no request crossed did nothing. A
        Toxiproxy server counts nothing: not observable (None)."""
        if self.link.api == "toxiproxy":
            return None
        link = self.client.link(self.link.name)
        hits = {t["name"]: int((t.get("counters") or {}).get("hits", 0))
                for t in link.get("toxics", []) if t.get("name") in self.toxic_names}
        missing = [n for n in self.toxic_names if n not in hits]
        evidence: dict[str, Any] = {"toxic_hits": hits,
                                    "link_connections": (link.get("counters") or {}
                                                         ).get("connections")}
        if missing:
            evidence["toxics_missing"] = missing
        return Effect(any(hits.values()), "the fault proxy's count of what each toxic acted on "
                      "(GET /links/NAME)", evidence)

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        inv = entry.inverse
        client = control_client(inv["control"], inv.get("api", "ordeal"), inv["link"],
                                inv.get("proxy"), inv.get("timeout_s", 5.0))
        # An unreachable proxy that did not refuse (a timeout) may still run:
        # that raises, the entry stays, and a later heal-all retries.
        return remove_toxics(client, inv["link"], inv["toxics"])

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        inv = entry.inverse
        if done.get("proxy") == "gone":
            return (f"{healed(entry, 'closed')}: the fault proxy at {inv['control']} is gone, "
                    "so its toxics are gone: nothing to heal")
        return (f"{healed(entry)}: removed {done['removed']} toxic(s) from link {inv['link']} "
                f"at {inv['control']}"
                + (f", {done['already_gone']} already gone" if done["already_gone"] else ""))


def control_client(control: str, api: str, link: str, proxy: str | None,
                   timeout_s: float) -> ProxyClient:
    """The client of a link's control API: Ordeal's fault proxy, or a
    Toxiproxy server (the link's proxy there named ``proxy``)."""
    if api == "toxiproxy":
        return ToxiproxyClient(control, {link: proxy or link}, timeout=timeout_s)
    return ProxyClient(control, timeout=timeout_s)


def remove_toxics(client: ProxyClient, link: str, names: list[str]) -> dict[str, Any]:
    """Remove in reverse order of adding; a 404 means already gone. A dead
    proxy (connection refused) holds no toxic: nothing to remove. What the
    removed L7 toxics did comes back as ``toxic_counters`` (name -> responses,
    sse_responses, events_changed): a window whose planted corruption nobody
    saw can tell "no response started through the link" from "rewritten but
    missed"."""
    removed, gone = 0, 0
    counters: dict[str, Any] = {}
    for name in reversed(names):
        try:
            got = client.take_toxic(link, name)
        except ProxyUnreachable as e:
            if e.refused:
                return {"removed": removed, "already_gone": len(names) - removed,
                        "proxy": "gone"}
            raise
        if got is None:
            gone += 1
            continue
        removed += 1
        if isinstance(got.get("counters"), dict):
            counters[name] = got["counters"]
    done: dict[str, Any] = {"removed": removed, "already_gone": gone}
    if counters:
        done["toxic_counters"] = counters
    return done
