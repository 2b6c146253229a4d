"""The event loop the load runs on (``--load-loop``): uvloop where it is
installed, else asyncio's own.

Why uvloop: the client's cost per streamed chunk is mostly the event loop's
(a read, a callback, a future per chunk). Side by side in one run
(``python -m bench.bench_loop``, bench/results/loop.json), the same client on
uvloop spent x0.71-0.82 of asyncio's CPU per chunk on both load shapes (two runs). uvloop
comes with vLLM's own dependencies (uvicorn's), so it is there wherever the
embedded cluster runs; elsewhere ``auto`` falls back to asyncio and says so.
``--load-loop asyncio`` rules the loop out when a run behaves oddly.
summary.json ``load_loop`` says which loop ran.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, TypeVar

from ordeal.config import ConfigError

T = TypeVar("T")
LOOPS = ("auto", "uvloop", "asyncio")


def _uvloop() -> Any:
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return None
    return uvloop


def check_loop(name: str) -> str:
    """``name`` if it can run here, else a ConfigError that says what to do."""
    if name not in LOOPS:
        raise ConfigError(f"--load-loop {name!r}: choose one of {', '.join(LOOPS)}")
    if name == "uvloop" and _uvloop() is None:
        raise ConfigError("--load-loop uvloop: uvloop is not installed in this environment; "
                          "install it (pip install uvloop) or give --load-loop auto")
    return name


def describe(name: str) -> str:
    """Which loop ``name`` runs here, for summary.json: "uvloop 0.23.0",
    "asyncio", or "asyncio (uvloop is not installed)"."""
    uv = _uvloop() if name != "asyncio" else None
    if uv is not None:
        return f"uvloop {getattr(uv, '__version__', '?')}"
    return "asyncio (uvloop is not installed)" if name == "auto" else "asyncio"


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``asyncio.Runner`` (None: asyncio's default loop)."""
    uv = _uvloop() if check_loop(name) != "asyncio" else None
    return uv.new_event_loop if uv is not None else None


def run(coro: Coroutine[Any, Any, T], name: str = "auto") -> T:
    """``asyncio.run(coro)`` on the loop ``name`` chooses."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(coro)
