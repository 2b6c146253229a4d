"""--load-loop: the loop each name runs, what summary.json says, and the
refusals (load/event_loop.py)."""

from __future__ import annotations

import asyncio
import builtins

import pytest

from load import event_loop
from ordeal.config import ConfigError


async def running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_each_name_runs_its_loop():
    pytest.importorskip("uvloop", reason="uvloop comes with vLLM's dependencies; not installed")
    assert event_loop.run(running_loop_module(), "asyncio").startswith("asyncio")
    assert event_loop.run(running_loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(running_loop_module(), "auto").startswith("uvloop")
    assert event_loop.describe("auto").startswith("uvloop ")
    assert event_loop.describe("asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch):
    real_import = builtins.__import__

    def no_uvloop(name, *args, **kwargs):
        if name == "uvloop":
            raise ImportError("no uvloop here (the test hides it)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert event_loop.run(running_loop_module(), "auto").startswith("asyncio")
    assert event_loop.describe("auto") == "asyncio (uvloop is not installed)"
    with pytest.raises(ConfigError, match="uvloop is not installed.*--load-loop auto"):
        event_loop.check_loop("uvloop")


def test_an_unknown_loop_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="--load-loop 'trio': choose one of auto, uvloop"):
        event_loop.check_loop("trio")
