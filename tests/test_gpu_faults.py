"""gpu_throttle and gpu_memory_pressure on a real GPU, read back through NVML.

No vLLM is needed: the "replica" is a plain labelled process (the faults
only need a live node), and the victim whose compute is taken away is a
bf16 matmul loop in this test process. Skipped where there is no CUDA
device (this suite's CI machines); run on a GPU machine with
``python -m pytest tests/test_gpu_faults.py -s`` to see the NVML figures.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faults import Ledger
from faults.cotenant import GpuSample, nvml_device_count, nvml_sample, proc_start_time
from faults.gpu_memory_pressure import GpuMemoryPressure
from faults.gpu_throttle import GpuThrottle
from nodes.local import LocalNode
from nodes.process import ManagedProcess
from ordeal.topology import Endpoint

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent


def no_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "no CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    if nvml_device_count() == 0:
        return "no CUDA device visible to NVML (nvidia-ml-py missing or no driver)"
    return None


REASON = no_cuda_reason()
# Device time is scarce: no test here may hang for the default 10 minutes.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(120)]

#: Throttle reasons that mean "slowed by power or heat" (NVML bit masks).
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SwPowerCap HwSlowdown SwThermal HwThermal PowerBrake


def figures(name: str, **values: object) -> None:
    print(f"[figures] {name}: {json.dumps(values)}", flush=True)


@pytest.fixture
def node(tmp_path):
    """A live node to aim at: the faults only need it running."""
    proc = ManagedProcess("gpu-node", [PY, "-c", "import time; time.sleep(600)"],
                          dict(os.environ), tmp_path / "node.log", "gpu-run")
    n = LocalNode("gpu-node", "replica", Endpoint("127.0.0.1", 9), proc, hint="")
    n.start()
    try:
        yield n
    finally:
        n.stop(grace=2)


class Sampler:
    """NVML samples every 0.1 s in a thread, while a phase runs."""

    def __init__(self):
        self.samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(nvml_sample(0))
            time.sleep(0.1)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def victim_tflops(seconds: float = 3.0, size: int = 8192) -> tuple[float, list[GpuSample]]:
    """The work whose compute a throttle takes away: bf16 matmuls for
    ``seconds``, with NVML sampled meanwhile."""
    import torch

    a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    n = 0
    with Sampler() as s:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            n += 10
        elapsed = time.perf_counter() - t0
    return round(2 * size**3 * n / elapsed / 1e12, 1), s.samples


def summary(samples: list[GpuSample]) -> dict[str, object]:
    return {"sm_clock_mhz_median": statistics.median(x.sm_clock_mhz for x in samples),
            "sm_clock_mhz_min": min(x.sm_clock_mhz for x in samples),
            "sm_clock_max_mhz": samples[0].sm_clock_max_mhz,
            "util_pct_median": statistics.median(x.util_gpu_pct for x in samples),
            "power_w_median": statistics.median(x.power_w for x in samples),
            "reasons_seen": sorted({hex(x.clocks_event_reasons) for x in samples}),
            "mem_used_mb_max": max(x.mem_used_mb for x in samples)}


def test_gpu_throttle_by_cotenant_load_is_seen_in_nvml_and_healed(node, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    before, s_before = victim_tflops()
    fault = GpuThrottle(node, "gpu-run", ledger)  # backend auto: CUDA here
    try:
        injected = fault.inject()
        assert injected["analog"] == "cuda-matmul", injected
        hog = injected["helper_pid"]
        during, s_during = victim_tflops()
    finally:
        fault.heal()
    assert proc_start_time(hog) is None and ledger.pending() == []
    time.sleep(1)
    after, s_after = victim_tflops()
    figures("gpu_throttle cuda-matmul", victim_tflops_before=before, during=during, after=after,
            nvml_before=summary(s_before), nvml_during=summary(s_during),
            nvml_after=summary(s_after))
    # The victim lost compute to the co-tenant, and got it back after heal.
    assert during < 0.75 * before, (before, during)
    assert after > 0.8 * before, (before, after)
    # NVML saw the GPU busy and slowed (clock below max or a power/thermal
    # reason) while both ran: a throttle by load alone.
    assert statistics.median(x.util_gpu_pct for x in s_during) >= 90
    assert any(x.sm_clock_mhz < x.sm_clock_max_mhz or x.clocks_event_reasons & SLOWDOWN_BITS
               for x in s_during)


def wait_mem_used(ok, timeout: float = 20.0) -> int:
    t0 = time.monotonic()
    while True:
        used = nvml_sample(0).mem_used_mb
        if ok(used) or time.monotonic() - t0 > timeout:
            return used
        time.sleep(0.2)


def test_gpu_memory_pressure_is_seen_in_nvml_and_released(node, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    first = nvml_sample(0)
    before, total = first.mem_used_mb, first.mem_total_mb
    fault = GpuMemoryPressure(node, "gpu-run", ledger, fraction=0.5)
    try:
        injected = fault.inject()
        assert injected["analog"] == "cuda-memory", injected
        during = wait_mem_used(lambda u: u - before >= 0.45 * total)
    finally:
        fault.heal()
    after = wait_mem_used(lambda u: u - before <= 1024)
    figures("gpu_memory_pressure cuda-memory", mem_total_mb=total, mem_used_mb_before=before,
            during=during, after=after)
    assert during - before >= 0.45 * total, (before, during, total)
    assert after - before <= 1024, (before, after)
    assert ledger.pending() == []


CHILD = r"""
import json, sys, time
from faults import Ledger
from faults.gpu_memory_pressure import GpuMemoryPressure
from nodes.process import group_members

class AttachedNode:
    role = "replica"
    clock_file = None
    def __init__(self, pid): self.name, self.pid = "gpu-node", pid
    def is_running(self): return bool(group_members(self.pid))
    def pids(self): return group_members(self.pid)

fault = GpuMemoryPressure(AttachedNode(int(sys.argv[1])), "crashed-run", Ledger(), fraction=0.3)
print("INJECTED " + json.dumps(fault.inject()), flush=True)
time.sleep(600)
"""


def test_crashed_harness_with_gpu_memory_held_is_healed_by_heal_all(node):
    # Keep the caller's PYTHONPATH: on a GPU machine the wheels it lacks
    # (crc32c, ...) are often on it; replacing it broke the child's imports.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")]))}
    before = nvml_sample(0).mem_used_mb
    child = subprocess.Popen([PY, "-c", CHILD, str(node.pid)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("INJECTED "), child.stderr.read() if not line else line
        hog = json.loads(line.split(" ", 1)[1])["helper_pid"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    held = nvml_sample(0).mem_used_mb
    assert proc_start_time(hog) is not None and held - before > 10_000  # orphaned, still holding
    done = subprocess.run([PY, "-m", "faults", "heal-all"], check=False, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "healed gpu_memory_pressure on gpu-node" in done.stdout, done
    after = wait_mem_used(lambda u: u - before <= 1024)
    figures("crash gpu_memory_pressure", mem_used_mb_before=before, held_after_sigkill=held,
            after_heal_all=after, heal_all=done.stdout.strip().splitlines())
    assert proc_start_time(hog) is None and after - before <= 1024
    assert Ledger().pending() == []
