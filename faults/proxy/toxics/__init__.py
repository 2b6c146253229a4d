"""Every toxic, registered by type name (``REGISTRY``), and ``build_toxic``
which turns a control-API payload into one or says exactly what is wrong."""

from __future__ import annotations

from typing import Any

from . import (  # noqa: F401
    bandwidth,
    http_abort,
    http_delay_head,
    http_hold,
    latency,
    limit_data,
    reset_peer,
    slicer,
    sse_corrupt_json,
    sse_cut,
    sse_drop,
    sse_duplicate,
    sse_error_event,
    sse_reorder,
    sse_rewrite_text,
    sse_rewrite_usage,
    sse_stall,
    timeout,
    truncate_body,
)
from .base import DIRECTIONS, REGISTRY, Toxic, ToxicError
from .l7 import L7Toxic

__all__ = ["REGISTRY", "Toxic", "L7Toxic", "ToxicError", "build_toxic", "validate_spec"]


def validate_spec(payload: Any) -> tuple[str, str, str, float, dict[str, Any]]:
    """Check a toxic spec's envelope; returns (name, type, direction,
    toxicity, attributes)."""
    if not isinstance(payload, dict):
        raise ToxicError("the toxic must be a JSON object with name, type, direction, "
                         "toxicity and attributes")
    unknown = sorted(set(payload) - {"name", "type", "direction", "toxicity", "attributes",
                                     "stream"})
    if unknown:
        raise ToxicError(f"unknown field(s) {unknown}; a toxic has name, type, direction, "
                         "toxicity, attributes")
    ttype = payload.get("type")
    if ttype not in REGISTRY:
        raise ToxicError(f"unknown toxic type {ttype!r}; known: {', '.join(sorted(REGISTRY))}")
    name = payload.get("name") or f"{ttype}_{payload.get('direction', 'downstream')}"
    if not isinstance(name, str) or not name or len(name) > 200 or "/" in name:
        raise ToxicError(f"toxic name {name!r}: use a non-empty string without '/'")
    direction = payload.get("direction", payload.get("stream", "downstream"))
    if direction not in DIRECTIONS:
        raise ToxicError(f"direction {direction!r}: use 'upstream' (client to server) or "
                         "'downstream' (server to client)")
    if REGISTRY[ttype].layer == "l7" and direction != "downstream":
        raise ToxicError(f"toxic {ttype!r} acts on HTTP responses: its direction must be "
                         "'downstream'")
    toxicity = payload.get("toxicity", 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, (int, float)) \
            or not 0.0 <= float(toxicity) <= 1.0:
        raise ToxicError(f"toxicity {toxicity!r}: must be a number within 0..1")
    attributes = payload.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise ToxicError(f"attributes must be a JSON object, got {attributes!r}")
    return name, ttype, direction, float(toxicity), attributes


def build_toxic(payload: Any) -> Toxic:
    name, ttype, direction, toxicity, attributes = validate_spec(payload)
    return REGISTRY[ttype].build(name, direction, toxicity, attributes)
