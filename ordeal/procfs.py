"""Reading /proc: the facts that name a process for good.

A pid alone can be reused; a pid with its start time (field 22 of
/proc/<pid>/stat) cannot. Every part of the suite that ends, stops or
continues a process checks these first, so it only ever touches what it
started. Linux only; no external tools.
"""

from __future__ import annotations

import os
from pathlib import Path


def status_kb(pid: int | str = "self") -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (VmRSS, RssAnon, RssFile, ...);
    {} when the process is gone."""
    out = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0])
    return out


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or
    None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def state(pid: int) -> str | None:
    """One letter (R, S, T, Z, ...), or None when the process is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def start_time(pid: int) -> str | None:
    """Start time in clock ticks since boot; None if gone or a zombie."""
    fields = stat_fields(pid)
    return None if not fields or fields[0] in ("Z", "X") else fields[19]


def pgid(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[2]) if fields else None


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with ({} if gone or unreadable).
    A process that renamed itself (setproctitle) may read as empty."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def group_members(group: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``group``."""
    return _members(2, group)


def session_members(session: int) -> list[int]:
    """Live (non-zombie) pids whose session is ``session``, in every
    process group of it."""
    return _members(3, session)


def _members(field: int, value: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields and fields[0] != "Z" and int(fields[field]) == value:
            members.append(int(entry))
    return members


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" when it
    is gone or a kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
