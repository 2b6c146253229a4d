"""The failure zoo (issue 40): failure shapes real inference stacks have
shown in public reports, one module each, planted inside the serving path
of a real cluster without telling the checkers. ``suites/test_zoo.py -m
zoo`` plants each one and records whether the default verdict caught it, by
which invariant and how fast, beside a clean run that must pass.

A new shape: a module here with ``SHAPE = Shape(...)`` (faults/zoo/base.py)
whose docstring names the reports it imitates, added to ``MODULES``."""

from __future__ import annotations

from . import (
    greedy_diverges,
    health_while_engine_hung,
    stream_cut_without_done,
    truncation_looks_complete,
    usage_mismatch,
    wrong_model_text,
)
from .base import Plant, Shape, ZooCluster

MODULES = (health_while_engine_hung, stream_cut_without_done, truncation_looks_complete,
           greedy_diverges, wrong_model_text, usage_mismatch)
SHAPES: dict[str, Shape] = {m.SHAPE.name: m.SHAPE for m in MODULES}

__all__ = ["SHAPES", "Shape", "Plant", "ZooCluster"]
