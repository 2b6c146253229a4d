"""YAML in block style, written by hand (``to_yaml``): PyYAML is not a
dependency of Ordeal, and what kubectl must read unambiguously is simple
to write: every string that YAML 1.1 or 1.2 could read as anything else
is double-quoted, every non-ASCII character escaped."""

from __future__ import annotations

import math
import re
from typing import Any

# ------------------------------------------------------------------ YAML

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
#: Words YAML 1.1 (PyYAML, kubectl's parser before 1.2) reads as booleans or null.
_NOT_PLAIN = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no YAML form here")
        return repr(v)
    s = str(v)
    if _PLAIN.fullmatch(s) and s.lower() not in _NOT_PLAIN:
        return s
    out = []
    for ch in s:  # a YAML double-quoted scalar, every non-ASCII character escaped
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def _nested(v: Any) -> bool:
    return isinstance(v, (dict, list)) and len(v) > 0


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return _scalar(v)


def _block(v: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(v, dict):
        for k, x in v.items():
            if _nested(x):
                lines.append(f"{pad}{_scalar(str(k))}:")
                _block(x, indent + 2, lines)
            else:
                lines.append(f"{pad}{_scalar(str(k))}: {_inline(x)}")
    else:
        for x in v:
            if _nested(x):
                sub: list[str] = []
                _block(x, indent + 2, sub)
                lines.append(f"{pad}- {sub[0][indent + 2:]}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_inline(x)}")


def to_yaml(doc: dict[str, Any]) -> str:
    """One YAML document in block style (what kubectl reads)."""
    lines: list[str] = []
    _block(doc, 0, lines)
    return "\n".join(lines) + "\n"
