"""Starting a process under libfaketime: the environment that makes it read
its wall clock from a control file, and that file (libfaketime's "+3600" /
"-120 x1.5" format). The engines and backends that start nodes use it, and
``faults/clock_drift.py`` rewrites the file; it sits here, below both,
rather than in faults/ (issue 41). Measured facts behind each setting are in
``faults/clock_drift.py``'s docstring and beside the settings.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: A clock file's first content: real time.
INITIAL = "+0"
#: How often a faked process re-reads its clock file. Measured on this 2-core
#: machine, tiny model, 128 greedy tokens, median of 8 (FORCE_MONOTONIC_FIX=0):
#: no libfaketime 459 tok/s, 1 s cache 460 tok/s, FAKETIME_NO_CACHE=1 313 tok/s
#: (every clock read opens and parses the file: time.time() 0.18 -> 1.6 us).
#: So a 1 s cache: free. libfaketime compares whole seconds, so a change
#: takes effect within a second more (faults.clock_drift ``EFFECT_DELAY_S``).
CACHE_DURATION_S = 1


def libfaketime_library() -> Path:
    """libfaketime.so.1 from the ``libfaketime`` wheel (found without
    importing it: its __init__ pulls in dateutil and pytz)."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("libfaketime is not installed in this environment: "
                                "pip install libfaketime (it is in the vllm extra)")
    lib = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    if not lib.exists():
        raise FileNotFoundError(f"the libfaketime wheel has no {lib}; reinstall it "
                                "(pip install --force-reinstall libfaketime)")
    return lib


#: Where Debian's libfaketime package puts the library: where Ordeal looks
#: in an image that runs its own engine (--docker-engine image).
DEBIAN_LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def faketime_env(clock_file: Path, library: str | Path | None = None) -> dict[str, str]:
    """Environment that starts a process with its wall clock read from
    ``clock_file`` (libfaketime's "+3600" / "-120 x1.5" format); ``library``:
    where the process finds libfaketime (default: this environment's)."""
    preload = [str(library or libfaketime_library())]
    if os.environ.get("LD_PRELOAD"):
        preload.append(os.environ["LD_PRELOAD"])
    return {
        "LD_PRELOAD": ":".join(preload),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_CACHE_DURATION": str(CACHE_DURATION_S),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # Its default "monotonic fix" rewrites every pthread_cond_timedwait,
        # which CPython's GIL hand-off uses: measured, a thread ping-pong beside
        # a busy thread fell from 25.5k to 2.7k round trips/s, and vLLM from
        # 459 to 32 tokens/s. With the monotonic clock left real, the fix has
        # nothing to fix.
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        # A skewed clock does not change the mtimes of files already on disk.
        "NO_FAKE_STAT": "1",
    }


def write_clock(clock_file: Path, spec: str) -> None:
    """Replace the file's content atomically (rename): a reader sees the
    old spec or the new one, never half of one."""
    clock_file = Path(clock_file)
    tmp = clock_file.with_name(f".{clock_file.name}.{os.getpid()}.tmp")
    tmp.write_text(spec + "\n")
    os.replace(tmp, clock_file)


def prepare_clock_file(clock_file: Path) -> None:
    """Create the control file with real time ("+0") before the node starts."""
    Path(clock_file).parent.mkdir(parents=True, exist_ok=True)
    write_clock(clock_file, INITIAL)


def read_clock(clock_file: Path) -> str:
    return Path(clock_file).read_text().strip()
