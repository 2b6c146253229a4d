"""What every layer may ask about a fault kind, declared once by the kind.

A fault kind's class (one module per kind under ``faults/``) declares its
``KindTraits``: where it acts (a node, a link that a plain TCP proxy can
carry, a link only Ordeal's HTTP/SSE proxy can carry), whether it stops or
restarts its target, how its effect is seen, whether an external target's
hook may act for it, its Chaos Mesh standing and its place in the endurance
cycle. Defining the class registers the traits here (``faults.base.Fault``).
The catalogue, the endurance plan, the Chaos Mesh export, the target file,
the fault factory and the failover checkers read these traits instead of
keeping lists of kind names of their own, so a new kind is its module (and
its suite), nothing else (docs/adding.md).

This module lives in the bottom layer so that ``ordeal.target``,
``ordeal.topology`` users and ``invariants`` (which may not import
``faults``) can ask. The registry fills when ``faults.catalogue`` imports
every kind's module; it then calls ``seal``. Asking before that raises
``KindsNotLoaded``: a checker that silently knew no kind would judge no
window and pass a broken stack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

ActsOn = Literal["node", "l4_link", "l7_link"]


class KindsNotLoaded(RuntimeError):
    """The fault catalogue was not imported before a kind's traits were
    asked for (a programming error, never the user's)."""


@dataclass(frozen=True)
class EnduranceChoice:
    """A kind's place in the endurance cycle: its target words, parameters
    a healthy two-replica stack behind a router should ride out, and its
    ``position`` in the cycle (lower first; equal positions by name). The
    built-in kinds keep the positions the cycle always had, so a seed
    still gives the plan it gave."""

    target: str = "one"
    params: Mapping[str, Any] = field(default_factory=dict)
    position: int = 100


@dataclass(frozen=True)
class KindTraits:
    """Everything Ordeal knows about a kind besides how it injects and heals.

    ``acts_on``: ``node`` (a replica or the router), ``l4_link`` (a proxy
    link; Toxiproxy can carry it too), ``l7_link`` (a link, read as HTTP and
    SSE: only Ordeal's fault proxy). ``backends``: the cluster backends that
    have this kind (empty: every one). ``stops_target``: the target answers
    nothing until the heal (the failover checkers judge these windows).
    ``restarts_target``: the heal restarts something and waits for it to
    serve (an endurance plan keeps restart time free after it).
    ``observed_in_answers``: its effect is seen only in the target's own
    answers (a thinned plan holds it longer). ``http1_only``: it acts on
    HTTP/1.1 exchanges only (its single-fault suites judge only those).
    ``hookable``: an external deployment's ``[[hook]]`` may act for it.
    ``on_gpu``: it acts on a GPU (on a replica placed on one, that one).
    ``chaos_mesh_none``: why the Chaos Mesh export has no equivalent ("":
    ``faults.chaos_mesh`` maps it); ``chaos_mesh_note``: what its mapping
    changes against Ordeal's own fault. ``endurance``: its place in the
    default endurance cycle (None: only when ``--faults`` names it)."""

    kind: str
    acts_on: ActsOn = "node"
    backends: tuple[str, ...] = ()
    stops_target: bool = False
    restarts_target: bool = False
    observed_in_answers: bool = False
    http1_only: bool = False
    hookable: bool = False
    on_gpu: bool = False
    chaos_mesh_none: str = ""
    chaos_mesh_note: str = ""
    endurance: EnduranceChoice | None = None

    @property
    def on_link(self) -> bool:
        return self.acts_on != "node"


_TRAITS: dict[str, KindTraits] = {}
_sealed = False


def register(traits: KindTraits) -> None:
    """Add a kind (``faults.base.Fault`` does it for each class that
    declares ``traits``); a second kind of the same name is refused."""
    old = _TRAITS.get(traits.kind)
    if old is not None and old != traits:
        raise ValueError(f"fault kind {traits.kind!r} is declared twice, differently")
    _TRAITS[traits.kind] = traits


def unregister(kind: str) -> None:
    """Take a kind out again (a test's throwaway kind)."""
    _TRAITS.pop(kind, None)


def seal() -> None:
    """Every built-in kind is registered (``faults.catalogue`` at import)."""
    global _sealed
    _sealed = True


def traits() -> Mapping[str, KindTraits]:
    """Every registered kind's traits, in registration order."""
    if not _sealed:
        raise KindsNotLoaded("the fault kinds are not loaded: import faults.catalogue before "
                             "asking what a kind does (it imports every kind's module)")
    return MappingProxyType(_TRAITS)


def of(kind: str) -> KindTraits | None:
    """One kind's traits; None for a name no kind has."""
    return traits().get(kind)


def where(test: Callable[[KindTraits], bool]) -> tuple[str, ...]:
    """The names of the kinds whose traits pass ``test``, by name (the
    order kinds register in follows their modules' imports)."""
    return tuple(sorted(k for k, t in traits().items() if test(t)))


def link_kinds() -> frozenset[str]:
    return frozenset(where(lambda t: t.on_link))


def l4_link_kinds() -> tuple[str, ...]:
    return where(lambda t: t.acts_on == "l4_link")


def l7_link_kinds() -> tuple[str, ...]:
    return where(lambda t: t.acts_on == "l7_link")


def hook_kinds() -> tuple[str, ...]:
    return where(lambda t: t.hookable)


def stopping_kinds() -> frozenset[str]:
    return frozenset(where(lambda t: t.stops_target))


def restarting_kinds() -> frozenset[str]:
    return frozenset(where(lambda t: t.restarts_target))


def gpu_kinds() -> tuple[str, ...]:
    return where(lambda t: t.on_gpu)
