"""The registry of fault kinds: every kind's class, by name. heal-all, the
schedule factory and ``python -m faults list|catalogue`` look kinds up
here.

A kind is one module of this package whose class declares ``traits``
(ordeal.kinds.KindTraits; faults/base.py registers it when the class is
defined). Importing this module imports every module of the package, so
no list of kinds is kept anywhere: a new kind's module is found as it is.
The modules that import this one (``CONSUMERS``) are the exception, since
they would import it back; tests/test_fault_kinds.py checks that no other
module does. Then ``ordeal.kinds.seal()`` lets the other layers ask.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from ordeal import kinds as kind_traits

from .base import CLASSES, Fault

#: This package's modules that import the catalogue (and so hold no kind).
CONSUMERS = frozenset({"__main__", "catalogue", "factory", "heal_all"})


def _import_every_kind() -> None:
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.ispkg and info.name not in CONSUMERS:
            importlib.import_module(f"{__package__}.{info.name}")
    kind_traits.seal()


_import_every_kind()

#: Every registered kind's class, by name (live: a kind registered later,
#: such as a test's throwaway kind, is in it too).
REGISTRY: dict[str, type[Fault]] = CLASSES


def common_kinds() -> tuple[str, ...]:
    """The kinds every backend runs (the endurance catalogue's), by name."""
    return kind_traits.where(lambda t: not t.backends)


def backend_kinds() -> tuple[str, ...]:
    """Kinds only some backends have (``--cluster ray``'s node faults)."""
    return kind_traits.where(lambda t: bool(t.backends))


def unregister(kind: str) -> None:
    """Take a kind out of the registry again (a test's throwaway kind)."""
    CLASSES.pop(kind, None)
    kind_traits.unregister(kind)


#: Linux capability bits (linux/capability.h) of the names kinds declare.
CAP_BITS: dict[str, int] = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's effective capability mask (``CapEff``); None where it
    cannot be read (then capabilities are not judged)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def tools_missing(which: Callable[[str], str | None] = shutil.which,
                  kinds: Iterable[str] | None = None) -> set[str]:
    """The programs the ``kinds`` (None: every kind) run (``Fault.tools``)
    that are not on PATH."""
    names = REGISTRY if kinds is None else kinds
    return {t for kind in names for t in REGISTRY[kind].tools if which(t) is None}


def unrunnable_kinds(euid: int, gpu_backend: str = "cpu", cap_eff: int | None = None,
                     kinds: Iterable[str] | None = None,
                     missing_tools: Iterable[str] = ()) -> dict[str, str]:
    """``{kind: why}`` for each of ``kinds`` this harness cannot inject, and
    exactly what is missing. Pure: the caller gives the effective uid, the
    effective capability mask (None: unknown, not judged) and the co-tenant
    backend ("cuda" where a GPU is seen, else "cpu": gpu_throttle needs root
    only for its CPU quota). A kind that needs root is refused to any other
    uid (``Fault._require_privilege``, the same rule), and to a root that
    lacks a capability the kind declares (a container's root without
    NET_ADMIN cannot use iptables), or whose program is in ``missing_tools``
    (``tools_missing``: not on PATH)."""
    missing_tools = set(missing_tools)
    out: dict[str, str] = {}
    for kind in (common_kinds() if kinds is None else kinds):
        cls = REGISTRY[kind]
        why = cls.root_reason_on(gpu_backend)
        if why is None:
            continue
        instead = f"; without root use {cls.without_root}" if cls.without_root else ""
        if euid != 0:
            out[kind] = (f"needs root (effective uid 0) and this harness runs as uid {euid} "
                         f"(why: {why}){instead}")
            continue
        gone = [t for t in cls.tools if t in missing_tools]
        if gone:
            out[kind] = (f"needs {', '.join(gone)}, which is not on this machine's PATH "
                         f"(install it: apt-get install {' '.join(gone)}){instead}")
            continue
        missing = [c for c in cls.capabilities
                   if cap_eff is not None and not cap_eff >> CAP_BITS[c] & 1]
        if missing:
            out[kind] = (f"needs {', '.join(missing)}, which this root harness lacks "
                         f"(CapEff {cap_eff:#x}) (why: {why}){instead}")
    return out
