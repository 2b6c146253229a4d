"""The failure zoo (issue 40): failure shapes real inference stacks have
shown in public reports, one module each, planted inside the serving path
of a real cluster without telling the checkers. ``suites/test_zoo.py -m
zoo`` plants each one and records whether the default verdict caught it, by
which invariant and how fast, beside a clean run that must pass.

A new shape: a module here with ``SHAPE = Shape(...)`` (faults/zoo/base.py)
whose docstring names the reports it imitates, added to ``MODULES``."""

from __future__ import annotations

from . import (
    decode_stall,
    greedy_diverges,
    health_while_engine_hung,
    html_5xx_hidden_by_retries,
    hung_backend_in_rotation,
    memory_leak,
    orphans_after_api_server_kill,
    request_runs_twice,
    stream_cut_without_done,
    truncation_looks_complete,
    usage_mismatch,
    wrong_model_text,
)
from .base import Plant, Shape, ZooCluster

MODULES = (health_while_engine_hung, hung_backend_in_rotation, stream_cut_without_done,
           truncation_looks_complete, greedy_diverges, wrong_model_text, usage_mismatch,
           decode_stall, request_runs_twice, memory_leak, html_5xx_hidden_by_retries,
           orphans_after_api_server_kill)
SHAPES: dict[str, Shape] = {m.SHAPE.name: m.SHAPE for m in MODULES}

#: Shapes of issue 40 not planted yet, with what planting each needs; the
#: zoo's table lists them as not measured (never as caught). None today.
PENDING: dict[str, str] = {}

__all__ = ["SHAPES", "PENDING", "Shape", "Plant", "ZooCluster"]
