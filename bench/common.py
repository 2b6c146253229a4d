"""Shared by the benches: percentiles as vLLM computes them, the machine's
description, progress lines, result files, and child processes we start and
end by their own id."""

from __future__ import annotations

import json
import os
import platform
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PY = sys.executable


def pct(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, as numpy's
    default and ``vllm bench serve`` compute it; None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def diff_pct(ours: float | None, ref: float | None) -> float | None:
    """(ours - ref) / ref in %, rounded; None when either is missing or ref is 0."""
    if ours is None or ref is None or ref == 0:
        return None
    return round((ours - ref) / ref * 100, 2)


def r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:5.0f}s] {msg}",
          flush=True)


def machine() -> dict[str, Any]:
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    osname = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": mem_gib,
            "os": osname or platform.platform(), "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": os.getloadavg(),
            "shared": "possibly, with other processes (the load average says how busy); "
                      "figures are side by side or interleaved in one run so ratios stand"}


def write_json(name: str, data: dict[str, Any]) -> Path:
    """bench/results/NAME.json, stamped with when it was written (the
    summary's date for its rows: a file's mtime is the clone's, not the run's)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / f"{name}.json"
    data = {**data, "written_utc": utc_now()}
    p.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return p


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def written(p: Path) -> str:
    """When a result file was written: its own stamp, else the date of the
    commit that last changed it, else "date unknown"."""
    try:
        d = json.loads(p.read_text())
        stamp = d.get("written_utc") or d.get("when")
    except (OSError, ValueError, AttributeError):
        stamp = None
    if stamp:
        return str(stamp)
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cd",
                              "--date=format-local:%Y-%m-%d %H:%M UTC", "--", p.name],
                             cwd=p.parent, capture_output=True, text=True, timeout=10,
                             env={**os.environ, "TZ": "UTC"})
        return out.stdout.strip() or "date unknown"
    except (OSError, subprocess.SubprocessError):
        return "date unknown"


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Child:
    """A helper process in its own session, ended by its own pid only."""

    def __init__(self, argv: Sequence[str], log: Path | None = None,
                 env: dict[str, str] | None = None, stdin_pipe: bool = False):
        e = dict(os.environ if env is None else env)
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))
        self.argv = list(argv)
        self.log = log
        err = open(log, "ab") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err,
                                     stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                                     env=e, start_new_session=True)
        self.stdin = self.proc.stdin
        self._buf = b""
        if log:
            err.close()  # type: ignore[union-attr]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_line(self, prefix: str | tuple[str, ...], timeout: float = 30.0,
                  give_up: bool = True) -> str | None:
        """The first stdout line starting with ``prefix``. Reads the raw fd
        with its own buffer: select() on a buffered reader misses lines that
        the reader already pulled in (seen: a DONE line waited forever)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith(prefix):
                    return line.strip()
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    break
                self._buf += data
            elif self.proc.poll() is not None:
                break
        if not give_up and self.proc.poll() is None:
            return None  # not yet: the caller polls again
        self.stop()
        raise RuntimeError(f"{self.argv[:4]}... did not print {prefix!r} in {timeout}s "
                           f"(exit {self.proc.poll()}); log: {self.log}")

    def stop(self, grace: float = 5.0) -> str:
        """SIGTERM, then SIGKILL; returns what it printed on stdout after."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        rest = self.proc.stdout.read() if self.proc.stdout else b""
        return (self._buf + rest).decode(errors="replace")


def start_sse_server(itl_ms: float, cpu: int | None = None, tokens: int | None = None,
                     log: Path | None = None, phases: str = "arrival") -> tuple[Child, int]:
    argv = [PY, str(ROOT / "bench" / "sse_server.py"), "--itl-ms", str(itl_ms),
            "--phases", phases]
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    if tokens is not None:
        argv += ["--tokens", str(tokens)]
    child = Child(argv, log)
    line = child.wait_line("READY")
    return child, int(line.split()[1])
