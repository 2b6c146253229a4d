"""Every engine by its ``--engine`` name. Apart from ``engines.base`` so
that the adapters import the interface and this module imports them, with
no cycle."""

from __future__ import annotations

from typing import Any

from engines.base import Engine
from engines.triton.adapter import TritonEngine
from engines.vllm.adapter import VllmEngine

ENGINES: dict[str, type] = {"vllm": VllmEngine, "triton": TritonEngine}


def engine_for(name: str, spec: Any = None) -> Engine:
    """The adapter of engine ``name`` for a cluster of ``spec`` (a
    ClusterSpec; None: the defaults); a ValueError names the known ones."""
    try:
        cls = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}") from None
    return cls(spec)
