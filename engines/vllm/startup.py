"""Where a vLLM replica's (re)start spends its time, read from its own log.

``restart_readiness`` knows only the total (spawn to /health 200); a restart
under load took 141 s in one run and 39 s in another against a 24 s first
start. The replica's log says where the time went: the harness's banner
(``nodes.process``: the spawn, to the millisecond) and vLLM's own lines
(``(APIServer pid=N) INFO MM-DD HH:MM:SS [file:line] ...``, to the second)
mark each step of a start. Parsing is pure, so it is tested on log text.

The log's times come from the replica's wall clock: under a ``clock_drift``
fault they are the faked time, and phases then read as the fault made them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from ordeal.history.ops import parse_iso

BANNER = re.compile(r"^=== ordeal: start #(\d+) of (\S+) at (\S+): ")
VLLM_LINE = re.compile(r"^\((\w+) pid=\d+\) [A-Z]+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[")

#: The steps of a vLLM start, in order: (name, what ends it: a pattern of
#: the line that marks it). A phase is the time from the previous mark.
MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("api_server_imports", re.compile(r"^\(APIServer pid=")),  # first line: Python + vLLM imported
    ("engine_core_spawn", re.compile(r"Initializing a V1 LLM engine")),  # config, EngineCore up
    # the worker imported: a process of its own on CPU; on the GPU build of
    # vLLM 0.26 (one GPU) inside the EngineCore, which says the second
    ("worker_spawn", re.compile(r"Starting to load model|Loading model from scratch")),
    ("weights_load", re.compile(r"Loading weights took")),
    ("engine_init", re.compile(r"init engine \(profile, create kv cache")),  # KV cache, warm-up
    ("api_server_listen", re.compile(r"Starting vLLM server on")),
)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float


def _line_time(line: str, year: int) -> float | None:
    m = VLLM_LINE.match(line)
    if m is None:
        return None
    month, day, hh, mm, ss = (int(x) for x in m.groups()[1:])
    try:
        return datetime(year, month, day, hh, mm, ss, tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def last_banner(lines: list[str]) -> tuple[int, re.Match[str]] | None:
    """The index and match of the last start's banner in ``lines``."""
    for i in range(len(lines) - 1, -1, -1):
        m = BANNER.match(lines[i])
        if m:
            return i, m
    return None


def startup_phases(lines: list[str], ready_wall: float | None = None) -> dict[str, object]:
    """The phases of the last start in ``lines`` (a replica's log): from the
    harness's banner to each milestone vLLM logged, and, given
    ``ready_wall`` (epoch seconds when /health first answered 200), the
    last step to that. A milestone not logged (yet) ends the list, said in
    ``missing``. vLLM logs whole seconds: each phase is +-1 s."""
    found = last_banner(lines)
    start = None if found is None else (found[0], int(found[1].group(1)),
                                        parse_iso(found[1].group(3)))
    if start is None or start[2] is None:
        return {"error": "no start banner with a time in the log (older harness or log cut)"}
    index, number, t0 = start
    year = datetime.fromtimestamp(t0, tz=timezone.utc).year
    phases: list[Phase] = []
    previous = t0
    todo = list(MILESTONES)
    for line in lines[index + 1:]:
        if not todo:
            break
        name, pattern = todo[0]
        if pattern.search(line):
            at = _line_time(line, year)
            if at is None:
                continue
            # vLLM's whole seconds may read a moment before the banner's ms.
            phases.append(Phase(name, round(max(0.0, at - previous), 1)))
            previous = max(previous, at)
            todo.pop(0)
    if not todo and ready_wall is not None:
        phases.append(Phase("health_ok", round(max(0.0, ready_wall - previous), 1)))
    out: dict[str, object] = {"start": number,
                              "phases": {p.name: p.seconds for p in phases},
                              "slowest": max(phases, key=lambda p: p.seconds).name if phases
                              else None}
    if todo:
        out["missing"] = [name for name, _ in todo]
    return out


#: vLLM's own words when a start meets a full device or too little host
#: memory (vLLM 0.26-0.32: ``v1/worker/utils.py``, ``v1/core/kv_cache_utils.py``,
#: ``v1/worker/cpu_worker.py``, ``gpu_model_runner.py``; torch's allocators).
#: A restart while a co-tenant holds the memory must fail with one of these
#: in its finding, never hang.
OUT_OF_MEMORY: tuple[str, ...] = (
    "is less than desired GPU memory utilization",  # GPU: free memory at start
    "No available memory for the cache blocks",
    "larger than the available KV cache memory",
    "is less than requested memory for kv",  # CPU: VLLM_CPU_KVCACHE_SPACE does not fit
    "Failed to load model - not enough GPU memory",
    "CUDA out of memory",
    "CUDA error: out of memory",
    "DefaultCPUAllocator: can't allocate memory",
)
#: The process prefix and level vLLM puts before a logged line.
_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s*)?")


def failure_reason(lines: list[str]) -> str | None:
    """``out of memory: <vLLM's line>`` for the first line of ``lines`` (a
    failed start's log, after its last banner) that says vLLM met too little
    memory; None when no line says so. The first, because vLLM's engine
    states the cause before the API server's own "initialization failed"
    traceback repeats it."""
    found = last_banner(lines)
    for line in lines[found[0] + 1:] if found else lines:
        if any(p in line for p in OUT_OF_MEMORY):
            return "out of memory: " + _PREFIX.sub("", line.strip())[:400]
    return None
