"""Co-tenants: labelled helper processes that sit beside a node and take
something away from it (memory, GPU compute, GPU memory), plus the
small process plumbing every helper of a fault needs (the clock strober too).

Why a separate process: a hog must outlive neither its fault nor a crashed
harness unnoticed. Each helper runs in a session of its own, carries
ORDEAL_RUN_ID (the test run of its fault) / ORDEAL_NODE / ORDEAL_HELPER (a
unique tag) in its environment (``ordeal.ownership``'s labels), and is
recorded as (pid, start time, tag) in the ledger, so the heal (``undo``, live
or after a crash) can end exactly it, and nothing else: we kill by pid after
checking the start time or the tag, never by name.

Run as ``python -m faults.cotenant MODE ...``:

- ``memory --mb 1024``: allocate and touch N MB of RAM, then hold it
- ``cuda-matmul --device 0 --size 8192``: bf16 matmuls in a loop (the GPU is
  then throttled by load alone: power cap, clocks; no setting is touched)
- ``cuda-memory --device 0 --fraction 0.8``: hold a share of device memory

Each mode prints one line ``READY ...`` once its load is in place. (A CPU
busy-loop mode was measured to take nothing from a replica here, because
sched autogroup shares CPU per session: gpu_throttle's CPU analog is a
cgroup CPU quota instead, faults/cgroup.py.)
NEVER does any mode change GPU clocks, power limits, persistence or compute
mode: the throttle comes from load only.

pynvml and torch are imported where they are used, not at the top: they
are optional (a CPU machine has neither, or no driver for them) and torch
takes seconds to import, which only a CUDA helper process needs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ordeal.config import state_dir
from ordeal.ownership import HELPER_ENV, NODE_ENV, OWNER_PID_ENV, RUN_ENV
from ordeal.procfs import environ as proc_environ
from ordeal.procfs import start_time as proc_start_time
from ordeal.procfs import state, status_kb
from ordeal.topology import Node
from ordeal.workers import visible_gpus

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .safety import require_running

READY = "READY"


# --- /proc reading ----------------------------------------------------------

def pids_with_tag(tag: str) -> list[int]:
    """Live processes whose environment carries ORDEAL_HELPER=tag: how a
    helper is found when a crash came between spawning it and recording its
    pid. The tag is a fresh uuid, so it matches only what we started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and proc_start_time(int(entry)) is not None \
                and proc_environ(int(entry)).get(HELPER_ENV) == tag:
            found.append(int(entry))
    return found


def rss_bytes(pid: int) -> int:
    """Resident set of one process (VmRSS), 0 if it is gone."""
    return status_kb(pid).get("VmRSS", 0) * 1024


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def node_cpus(pids: Sequence[int]) -> list[int]:
    """Every CPU any of the node's processes may run on (union of their
    affinities): with ``--replica-cpus own`` the replica's own cores. Measured
    when replicas shared the cores: loading only the core a vLLM CPU worker
    is bound to (VLLM_CPU_OMP_THREADS_BIND) left the tiny model's throughput
    unchanged (1.03x), because its API server and EngineCore, free to run
    anywhere, were the bottleneck and moved to the other core. Falls back to
    every CPU this process may use when no pid can be read."""
    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= os.sched_getaffinity(pid)
        except OSError:
            continue
    return sorted(cpus or os.sched_getaffinity(0))


# --- labelled helper processes ----------------------------------------------

@dataclass(frozen=True)
class Helper:
    """A running helper, as the ledger records it (plain data)."""

    pid: int
    start_time: str
    tag: str
    argv: list[str]
    log: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_tag() -> str:
    return uuid.uuid4().hex


def helper_log_path(tag: str) -> Path:
    return state_dir() / "helpers" / f"{tag}.log"


def spawn_helper(argv: Sequence[str], run_id: str, node_name: str, tag: str,
                 ready_timeout_s: float = 60.0, extra_env: dict[str, str] | None = None) -> Helper:
    """Start ``argv`` in its own session with our labels, and wait until its
    log shows a ``READY`` line (its load is in place) or it dies. The log is
    under the state dir, so a helper that failed says why."""
    log = helper_log_path(tag)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(extra_env or {}), RUN_ENV: run_id, NODE_ENV: node_name,
           HELPER_ENV: tag, OWNER_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    repo_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    with log.open("ab") as out:
        proc = subprocess.Popen(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    start = proc_start_time(proc.pid) or ""
    helper = Helper(proc.pid, start, tag, list(argv), str(log))
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if any(line.startswith(READY) for line in _log_lines(log)):
            return helper
        if proc.poll() is not None:
            raise RuntimeError(f"helper {' '.join(argv)} exited with code {proc.returncode} "
                               f"before it was ready; its log {log} ends: "
                               f"{_log_lines(log)[-5:]}")
        time.sleep(0.05)
    end_helper(helper.as_dict())
    raise RuntimeError(f"helper {' '.join(argv)} was not ready within {ready_timeout_s}s "
                       f"(no {READY} line in {log}); it was ended. Log ends: "
                       f"{_log_lines(log)[-5:]}")


def _log_lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []


def ready_info(helper: Helper) -> str:
    """The helper's READY line (what its load is), for the result dict."""
    for line in _log_lines(Path(helper.log)):
        if line.startswith(READY):
            return line
    return ""


def helper_alive(rec: dict[str, Any]) -> bool:
    return bool(_helper_pids(rec))


def _helper_pids(rec: dict[str, Any]) -> list[int]:
    """Live processes of a recorded helper: its leader if the start time
    still matches, plus any process carrying its tag (forked workers)."""
    pids = set(pids_with_tag(rec["tag"]))
    pid, start = rec.get("pid"), rec.get("start_time")
    if pid and start and proc_start_time(pid) == start:
        pids.add(pid)
    return sorted(pids)


def end_helper(rec: dict[str, Any], timeout_s: float = 10.0) -> list[int]:
    """SIGKILL a recorded helper and every process carrying its tag, and wait
    until they are gone. Idempotent: an already-ended helper is a no-op.
    Returns the pids that were ended."""
    ended = _helper_pids(rec)
    for pid in ended:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    # Ours until waitpid reaps them or says they are not ours; the recorded
    # pid too when it is already a zombie (it died on its own, unreaped).
    unreaped = set(ended) | ({rec["pid"]} if rec.get("pid") and state(rec["pid"]) == "Z"
                             else set())
    while time.monotonic() < deadline:
        for pid in list(unreaped):  # reap our own children so they do not linger as zombies
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    unreaped.discard(pid)
            except ChildProcessError:  # not our child (or reaped): its parent reaps it
                unreaped.discard(pid)
        # A zombie reads as gone (no start time), but /proc still has it until
        # it is reaped: wait for both. A 1 GB memory hog takes a while to exit.
        if not _helper_pids(rec) and not unreaped:
            break
        time.sleep(0.05)
    left = _helper_pids(rec)
    if left:
        raise RuntimeError(f"helper {rec['tag']} processes {left} survived SIGKILL for "
                           f"{timeout_s}s; look at them with ps -o pid,stat,cmd -p "
                           f"{','.join(map(str, left))}")
    return ended


def helper_argv(mode: str, *args: str) -> list[str]:
    """argv that names what it is in ps: python -m faults.cotenant MODE ..."""
    return [sys.executable, "-m", "faults.cotenant", mode, *args]


# --- NVML readback -------------------------------------------------------------

@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of a GPU: what a throttle or pressure fault proves
    itself with."""

    sm_clock_mhz: int
    sm_clock_max_mhz: int
    clocks_event_reasons: int  # bit mask: 0x4 SwPowerCap, 0x8 HwSlowdown, 0x20 SwThermal...
    util_gpu_pct: int
    mem_used_mb: int
    mem_total_mb: int
    power_w: float


def nvml_device_count() -> int:
    """Number of GPUs NVML sees; 0 when there is no NVML (no driver, or
    nvidia-ml-py not installed), which is how a CPU-only machine looks."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU here
        return 0


_nvml_initialised = False


def nvml_sample(index: int = 0) -> GpuSample:
    global _nvml_initialised
    import pynvml

    if not _nvml_initialised:  # once per process: samplers call this ten times a second
        pynvml.nvmlInit()
        _nvml_initialised = True
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return GpuSample(
        sm_clock_mhz=int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        sm_clock_max_mhz=int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
        clocks_event_reasons=_optional(lambda: int(reasons_fn(h))),
        util_gpu_pct=int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
        mem_used_mb=int(mem.used // 2**20),
        mem_total_mb=int(mem.total // 2**20),
        power_w=_optional(lambda: round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)),
    )


def _optional(read):
    """Some NVML readings are not supported in every VM; -1 says so."""
    import pynvml

    try:
        return read()
    except pynvml.NVMLError:
        return -1


# --- the fault shape shared by gpu_throttle and gpu_memory_pressure ------------

class CotenantFault(Fault):
    """A fault whose whole effect is one co-tenant helper beside the node:
    inject starts it, heal ends it. The ledger entry is written before the
    helper exists and names it by its tag; once it runs, the entry is
    rewritten with its pid and start time. So a crash at any point leaves
    enough for ``undo`` to end exactly it."""

    def __init__(self, node: Node, run_id: str, ledger: Ledger, backend: str = "auto",
                 device: int = 0):
        super().__init__(node.name, run_id, ledger)
        if backend not in ("auto", "cuda", "cpu"):
            raise ValueError(f"backend must be auto, cuda or cpu, not {backend!r}")
        self.node = node
        self.backend = backend
        self.device = device
        self.physical_gpu: int | None = None  # NVML's index of CUDA's device
        self._mem_before_mb: int | None = None  # device memory in use before a cuda-memory helper
        self.tag = new_tag()
        self.helper: Helper | None = None
        self._plan: tuple[list[str], str, dict[str, Any]] | None = None

    def _plan_helper(self, backend: str) -> tuple[list[str], str, dict[str, Any]]:
        """(helper argv, analog name, details for the result) for ``backend``;
        raise FaultError when the plan cannot work here."""
        raise NotImplementedError

    def _resolve_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "cuda" if nvml_device_count() > 0 else "cpu"

    def _preflight(self) -> None:
        require_running(self.node, self.kind)
        backend = self._resolve_backend()
        if backend == "cuda":
            count = nvml_device_count()
            # Under a pytest-xdist worker with --gpus-per-worker, CUDA sees
            # only the worker's GPUs: device i is the i-th of those.
            visible = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), count)
            if self.device >= len(visible):
                raise FaultError(
                    f"{self.kind}: GPU {self.device} is not there (NVML sees {count} GPU(s); "
                    f"this process may use {visible} by CUDA_VISIBLE_DEVICES); pick one of "
                    f"0..{len(visible) - 1}, or use backend='cpu' for a CPU replica")
            self.physical_gpu = visible[self.device]
        self._plan = self._plan_helper(backend)

    def _inverse(self) -> dict[str, Any]:
        assert self._plan is not None
        return {"helper": {"tag": self.tag, "pid": None, "start_time": None},
                "analog": self._plan[1]}

    def _act(self) -> dict[str, Any]:
        assert self._plan is not None and self.entry is not None
        argv, analog, details = self._plan
        if analog == "cuda-memory":
            # The device's memory in use before the co-tenant: its effect is
            # what it adds (replicas already hold most of a GPU's memory).
            self._mem_before_mb = nvml_sample(self.physical_gpu or 0).mem_used_mb
        self.helper = spawn_helper(argv, self.run_id, self.node.name, self.tag)
        self.entry.inverse["helper"] = self.helper.as_dict()
        self.ledger.record(self.entry)  # same id: now with pid and start time
        return {"analog": analog, "helper_pid": self.helper.pid,
                "helper_argv": " ".join(argv[1:]), "ready": ready_info(self.helper), **details}

    def observe(self) -> Effect:
        """The co-tenant runs and holds what it was started for: host RAM
        resident (memory), device memory used, or the device busy (NVML)."""
        assert self._plan is not None and self.entry is not None
        rec = self.entry.inverse["helper"]
        pids = _helper_pids(rec)
        analog, details = self._plan[1], self._plan[2]
        evidence: dict[str, Any] = {"analog": analog, "helper_pids": pids}
        if not pids:
            return Effect(False, "the co-tenant helper's process", evidence)
        if analog == "memory-hog":
            rss = sum(rss_bytes(p) for p in pids)
            evidence.update(rss_mb=rss >> 20, asked_mb=details["mb"])
            return Effect(rss >= 0.9 * details["mb"] * 2**20,
                          "the helper's resident memory (VmRSS)", evidence)
        sample = nvml_sample(self.physical_gpu or 0)
        evidence.update(mem_used_mb=sample.mem_used_mb, mem_total_mb=sample.mem_total_mb,
                        util_gpu_pct=sample.util_gpu_pct,
                        clocks_event_reasons=sample.clocks_event_reasons)
        if analog == "cuda-memory":
            before = self._mem_before_mb
            evidence["mem_used_before_mb"] = before
            grown = sample.mem_used_mb - (before if before is not None else 0)
            return Effect(grown >= 0.9 * details["fraction"] * sample.mem_total_mb,
                          "the device's used memory (NVML), grown by the co-tenant's share "
                          "since just before it started", evidence)
        return Effect(sample.util_gpu_pct >= 50, "the device's utilisation (NVML) with the "
                      "co-tenant running", evidence)

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        return {"ended_pids": end_helper(entry.inverse["helper"])}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        ended = done["ended_pids"]
        what = f"ended co-tenant {entry.inverse.get('analog')} pid(s) {ended}" if ended \
            else "its co-tenant was already gone"
        return f"{healed(entry)}: {what}"


# --- the hog modes (run inside the helper process) ------------------------------

def run_memory(mb: int) -> None:
    """Allocate ``mb`` MB and write one byte per page, so every page is
    resident (an untouched allocation costs the machine nothing)."""
    size = mb * 2**20
    buf = bytearray(size)
    for off in range(0, size, 4096):
        buf[off] = 1
    print(f"{READY} memory mb={mb} rss_bytes={rss_bytes(os.getpid())}", flush=True)
    while True:
        signal.pause()


def run_cuda_matmul(device: int, size: int) -> None:
    import torch

    dev = torch.device("cuda", device)
    a = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(dev)
    print(f"{READY} cuda-matmul device={device} size={size}", flush=True)
    while True:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize(dev)


def run_cuda_memory(device: int, fraction: float) -> None:
    import torch

    dev = torch.device("cuda", device)
    free, total = torch.cuda.mem_get_info(dev)
    want = int(total * fraction)
    if want > free - 2**30:
        raise SystemExit(f"cuda-memory: asked for {want >> 20} MiB ({fraction:.0%} of "
                         f"{total >> 20} MiB) but only {free >> 20} MiB is free; ask for less")
    x = torch.empty(want, dtype=torch.uint8, device=dev)
    x.fill_(1)  # touch it: the allocation is real, not lazy
    torch.cuda.synchronize(dev)
    print(f"{READY} cuda-memory device={device} bytes={want}", flush=True)
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults.cotenant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--mb", type=int, required=True)
    g = sub.add_parser("cuda-matmul")
    g.add_argument("--device", type=int, default=0)
    g.add_argument("--size", type=int, default=8192)
    p = sub.add_parser("cuda-memory")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--fraction", type=float, default=0.8)
    args = ap.parse_args(argv)
    if args.mode == "memory":
        run_memory(args.mb)
    elif args.mode == "cuda-matmul":
        run_cuda_matmul(args.device, args.size)
    else:
        run_cuda_memory(args.device, args.fraction)
    return 0


if __name__ == "__main__":
    sys.exit(main())
