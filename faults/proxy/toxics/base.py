"""What every toxic is: a name, a direction, a toxicity and typed parameters.

Like Toxiproxy's toxics/: one small module per toxic, registered by type
name, parameters as plain dataclass fields validated up front (a bad
attribute is refused with a message that names it), toxicity as a wrapper
decided once per connection. A toxic never owns a socket: it gets bytes (L4)
or SSE events (L7) and hands on what should pass, so removing it can always
release what it holds ("don't drop any data on the floor").
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Literal

if TYPE_CHECKING:  # pragma: no cover
    from ..connection import Connection

Direction = Literal["upstream", "downstream"]
DIRECTIONS: tuple[str, ...] = ("upstream", "downstream")
Emit = Callable[[bytes], Awaitable[None]]

REGISTRY: dict[str, type["Toxic"]] = {}
# Serial numbers: what per-connection and per-response caches key a toxic by.
# Not id(): a removed toxic's address is reused by the next object of its
# size, and a pooled keep-alive connection outlives many fault windows.
_SERIAL = itertools.count(1)


class ToxicError(ValueError):
    """A toxic that cannot be built as asked: the message names the field,
    the value and what would be accepted (the control API answers 400)."""


def field_range(lo: float | None = None, hi: float | None = None, default: Any = 0) -> Any:
    """A numeric parameter with bounds, checked by Toxic.build."""
    return dataclasses.field(default=default, metadata={"lo": lo, "hi": hi})


@dataclass(frozen=True)
class NoParams:
    pass


class Toxic:
    """Base of every toxic. Subclasses set ``type``, ``Params`` and override
    ``pipe`` (L4) or the L7 hooks in ``l7.L7Toxic``."""

    type: ClassVar[str] = ""
    layer: ClassVar[str] = "l4"
    Params: ClassVar[type] = NoParams

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.type:
            REGISTRY[cls.type] = cls

    def __init__(self, name: str, direction: Direction, toxicity: float, params: Any):
        self.name = name
        self.direction = direction
        self.toxicity = toxicity
        self.params = params
        self.uid = next(_SERIAL)
        # Set when the toxic is removed: whatever it holds is released at once.
        self.removed = asyncio.Event()
        # What it did (GET /links, and the final figures on removal). An L4
        # toxic counts the chunks it was given (the connection's writer
        # counts them); ``hits`` is what a link fault's observation reads.
        self.counters: dict[str, int] = {"chunks": 0}

    def hits(self) -> int:
        """How many times this toxic acted on the traffic: the evidence that
        a fault took effect (faults.link_fault.LinkFault.observe). A toxic
        that acts only on some chunks (reset_peer) counts those."""
        return self.counters["chunks"]

    # -- building and describing ------------------------------------------

    @classmethod
    def build(cls, name: str, direction: str, toxicity: float,
              attributes: dict[str, Any]) -> "Toxic":
        kinds = {f.name: f for f in dataclasses.fields(cls.Params)}
        unknown = sorted(set(attributes) - set(kinds))
        if unknown:
            raise ToxicError(f"toxic {cls.type!r}: unknown attribute(s) {unknown}; "
                             f"accepted: {sorted(kinds) or 'none'}")
        values: dict[str, Any] = {}
        for fname, f in kinds.items():
            if fname not in attributes:
                continue
            raw = attributes[fname]
            values[fname] = _coerce(cls.type, fname, raw, f)
        params = cls.Params(**values)
        cls.validate(params)
        return cls(name, direction, toxicity, params)  # type: ignore[arg-type]

    @classmethod
    def validate(cls, params: Any) -> None:
        """Cross-field checks beyond one field's range; raise ToxicError."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "direction": self.direction,
                "toxicity": self.toxicity, "attributes": dataclasses.asdict(self.params),
                "counters": {**self.counters, "hits": self.hits()}}

    # -- acting -------------------------------------------------------------

    async def hold(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: forever) unless the toxic is removed first.
        Returns True when the wait ended because of the removal."""
        if self.removed.is_set():
            return True
        if seconds is not None and seconds <= 0:
            return False
        try:
            await asyncio.wait_for(self.removed.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def pipe(self, conn: "Connection", data: bytes, arrived: float, emit: Emit) -> None:
        """L4: pass ``data`` (read at loop time ``arrived``) on through ``emit``."""
        await emit(data)


def _coerce(tname: str, fname: str, raw: Any, f: dataclasses.Field) -> Any:
    want = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str,
                                                     "bool": bool}.get(str(f.type), str)
    if want in (int, float):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} must be a number, "
                             f"got {raw!r}")
        if want is int and float(raw) != int(raw):
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} must be a whole number, "
                             f"got {raw!r}")
        value: Any = want(raw)
        lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
        if lo is not None and value < lo:
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} = {raw!r} is below "
                             f"the minimum {lo}")
        if hi is not None and value > hi:
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} = {raw!r} is above "
                             f"the maximum {hi}")
        return value
    if want is bool:
        if not isinstance(raw, bool):
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} must be true or false, "
                             f"got {raw!r}")
        return raw
    if want is str:
        if not isinstance(raw, str):
            raise ToxicError(f"toxic {tname!r}: attribute {fname!r} must be a string, "
                             f"got {raw!r}")
        return raw
    return raw
