"""A real GPU inference run under GPU faults: one Triton node
(engines.triton.pytriton) serving the tiny LM on CUDA, an open-loop load of streamed
generate requests, and on a schedule: gpu_throttle (a co-tenant's bf16
matmuls), gpu_memory_pressure (a co-tenant holding a share of device memory),
process_pause (SIGSTOP/SIGCONT of the whole node) and process_kill (SIGKILL,
restart, wait until ready), each followed by an after-heal window. NVML is
sampled through the run (load.gpu_telemetry via the monitor), the
invariants that apply judge the history, and summary.json gets the GPU by
phase (reports.gpu): SM clock and reason bits, memory, and TTFT/TPOT in each
phase, so the throttle, its effect on latency, the memory fault and the
recovery after each heal are in one table (also drawn in report.html).

The first ``--warmup`` seconds of the load (default 5) are the warm-up, not
steady state (CheckerSettings.warmup_s): a fresh node's first requests are
slow (an H200 run's steady TTFT p50 was 19 ms with them, 15.7 ms under the
throttle), so the steady baseline the throttle is compared with, and
throttle_explained, leave them out.

    python -m runs.gpu_scenario --out reports/runs

Needs an NVIDIA GPU, torch with CUDA, transformers and nvidia-pytriton
(plus tritonclient[grpc]); ``--device cpu`` runs the same on a CPU with
the CPU analogs of the GPU faults (throttle = a CPU quota, pressure = a
host memory hog).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from engines.registry import engine_for
from engines.triton.pytriton import MODEL_NAME, TritonNode, send_generate
from engines.vllm.model import ensure_tiny_model
from faults.base import Fault
from faults.gpu_memory_pressure import GpuMemoryPressure
from faults.gpu_throttle import GpuThrottle
from faults.ledger import Ledger
from faults.nemesis import FaultWindow, inject_then_heal
from faults.process_kill import ProcessKill
from faults.process_pause import ProcessPause
from invariants import (
    Availability,
    CountersMonotonic,
    ErrorRate,
    Goodput,
    LatencySLO,
    LeakBound,
    NoSilentLoss,
    Recovery,
    RestartReadiness,
)
from invariants.gpu import GpuMemoryBack, ThrottleExplained
from invariants.settings import CheckerSettings, SLOTargets
from load.monitor import Monitor
from load.plan import plan_requests
from load.spec import WorkloadSpec
from nodes.ports import free_ports
from ordeal.history.reader import read_history
from ordeal.topology import Endpoint
from reports.gpu import gpu_phases, throttle_effect
from reports.run_dir import RunDir
from runs.run import OrdealRun


class TritonCluster:
    """The smallest Cluster (ordeal.topology) around Triton nodes: no router
    and no proxied links yet (issue 6 adds them); clients talk to the node."""

    backend = "local"
    engine = "triton"

    def __init__(self, nodes: list[TritonNode], model: Any):
        self.nodes = nodes
        self.model = model

    @property
    def entrypoint(self) -> Endpoint:
        return self.nodes[0].endpoint

    def node(self, name: str) -> TritonNode:
        return next(n for n in self.nodes if n.name == name)

    def replicas(self) -> list[TritonNode]:
        return list(self.nodes)

    @property
    def links(self) -> list[Any]:
        return []

    def link(self, name: str) -> Any:
        raise KeyError(f"{name}: this Triton cluster has no proxied links yet")

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "engine": self.engine,
                "model": {"name": MODEL_NAME, "path": str(self.model.path),
                          "sha256": self.model.sha256},
                "entrypoint": self.entrypoint.url, "links": [],
                "nodes": [{"name": n.name, "role": n.role, "url": n.endpoint.url,
                           "grpc": n.grpc_url, "device": n.device,
                           "fingerprint": n.fingerprint()} for n in self.nodes]}


@dataclasses.dataclass
class Plan:
    """The schedule: each fault after ``quiet_s`` of load, held ``hold_s``,
    then ``after_heal_s`` of load before the next one."""

    quiet_s: float = 20.0
    hold_s: float = 15.0
    pause_s: float = 5.0
    after_heal_s: float = 15.0
    throttle_size: int = 8192
    memory_fraction: float = 0.8
    kinds: tuple[str, ...] = ("gpu_throttle", "gpu_memory_pressure", "process_pause",
                              "process_kill")


def make_fault(kind: str, node: TritonNode, run_id: str, ledger: Ledger, plan: Plan,
               backend: str) -> tuple[Fault, float]:
    if kind == "gpu_throttle":
        return GpuThrottle(node, run_id, ledger, backend=backend,
                           matmul_size=plan.throttle_size), plan.hold_s
    if kind == "gpu_memory_pressure":
        return GpuMemoryPressure(node, run_id, ledger, backend=backend,
                                 fraction=plan.memory_fraction), plan.hold_s
    if kind == "process_pause":
        return ProcessPause(node, run_id, ledger), plan.pause_s
    if kind == "process_kill":
        return ProcessKill(node, run_id, ledger, restart=True, ready_timeout_s=240), 0.0
    raise ValueError(f"{kind}: this scenario runs gpu_throttle, gpu_memory_pressure, "
                     "process_pause and process_kill")


async def drive(run: OrdealRun, node: TritonNode, spec: WorkloadSpec, plan: Plan,
                backend: str, monitor_interval_s: float) -> None:
    history = run.history
    ledger = Ledger()
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    sem = asyncio.Semaphore(spec.max_in_flight)

    async def one(req: Any) -> None:
        async with sem:
            temp = 0.0 if req.canary else req.temperature
            history.append("invoke", req.seq, "generate", {
                "seq": req.seq, "stream": True, "max_tokens": req.max_tokens,
                "prompt": req.prompt, "temperature": temp, "canary": req.canary})
            try:
                out = await send_generate(node.grpc_url, req.prompt, req.max_tokens, temp,
                                          spec.timeout_s, request_id=f"r{req.seq}")
            except asyncio.CancelledError:
                history.append("info", req.seq, "generate", {"seq": req.seq},
                               "cancelled by the harness before an answer")
                raise
            except Exception as e:  # noqa: BLE001 - a harness bug must not lose the op
                history.append("info", req.seq, "generate", {"seq": req.seq},
                               f"harness error: {type(e).__name__}: {e}")
                return
            history.append(out.type, req.seq, "generate", {"seq": req.seq, "node": node.name,
                                                           **out.value}, out.error)

    async def load() -> None:
        t0 = time.monotonic()
        for req in plan_requests(spec, limit_s=None):
            delay = t0 + req.at_s - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if stop.is_set():
                break
            t = asyncio.create_task(one(req))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)

    async def nemesis() -> None:
        await asyncio.sleep(plan.quiet_s)
        for kind in plan.kinds:
            fault, hold = make_fault(kind, node, run.run_id, ledger, plan, backend)
            window: FaultWindow = await inject_then_heal(fault, history, 0.0, hold, run.progress)
            run.windows.append(window)
            if window.error:
                run.errors.append(f"{window.kind} on {window.target}: {window.error}")
            await asyncio.sleep(plan.after_heal_s)
        stop.set()

    monitor = Monitor([node], history, interval_s=monitor_interval_s, gpu_procs=True,
                      common_metrics=engine_for("triton").collect_metrics)
    run.summary_extra["gpu_telemetry"] = monitor.gpu.describe()
    sampling = asyncio.create_task(monitor.run())
    loading = asyncio.create_task(load())
    try:
        await nemesis()
        await loading
    finally:
        stop.set()
        loading.cancel()
        sampling.cancel()
        await asyncio.gather(loading, sampling, return_exceptions=True)
        await asyncio.sleep(run.drain_s)
        await monitor.sample_all("drain")


def arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runs.gpu_scenario", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="reports/runs", help="runs root (a run dir is made in it)")
    p.add_argument("--device", default="cuda", help="cuda (GPU faults) or cpu (CPU analogs)")
    p.add_argument("--rate", type=float, default=8.0, help="requests/s, open loop (Poisson)")
    p.add_argument("--max-tokens", type=int, nargs=2, default=(16, 64))
    p.add_argument("--quiet", type=float, default=20.0, help="s of load before the first fault")
    p.add_argument("--hold", type=float, default=15.0, help="s each GPU fault stays injected")
    p.add_argument("--pause", type=float, default=5.0, help="s the node stays SIGSTOPped")
    p.add_argument("--after-heal", type=float, default=15.0, help="s of load after each heal")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="s from the load's first request that are the warm-up, left out of "
                        "the steady-state figures and judgements (0: none; less than --quiet)")
    p.add_argument("--memory-fraction", type=float, default=0.8)
    p.add_argument("--kinds", default="gpu_throttle,gpu_memory_pressure,process_pause,"
                                      "process_kill")
    p.add_argument("--monitor-interval", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-ms", type=float, default=250.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    return p


def main(argv: list[str] | None = None) -> int:
    p = arg_parser()
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.quiet:
        p.error(f"--warmup {args.warmup}: must be 0 or more and less than --quiet "
                f"{args.quiet}, so that some steady state comes before the first fault")
    backend = "cuda" if args.device.startswith("cuda") else "cpu"
    plan = Plan(quiet_s=args.quiet, hold_s=args.hold, pause_s=args.pause,
                after_heal_s=args.after_heal, memory_fraction=args.memory_fraction,
                kinds=tuple(k for k in args.kinds.split(",") if k))
    spec = WorkloadSpec(duration_s=3600, rate=args.rate, seed=args.seed,
                        max_tokens=tuple(args.max_tokens), canary_every=10, timeout_s=30.0,
                        max_in_flight=64)
    run_dir = RunDir.create(Path(args.out), "gpu-triton")
    model = ensure_tiny_model()
    http, grpc, metrics = free_ports(3)
    node = TritonNode("triton-0", Endpoint("127.0.0.1", http), grpc, metrics, model.path,
                      run_dir.logs / "triton-0.log", run_dir.run_id, device=args.device)
    cluster = TritonCluster([node], model)
    run = OrdealRun(run_dir, "gpu-triton", cluster,
                    progress=lambda m: print(f"[ordeal {time.strftime('%H:%M:%S')}] {m}",
                                             flush=True))
    run.schedule = [{"kind": k, "target": node.name} for k in plan.kinds]
    run.load_loop = "asyncio"  # drive() below runs on asyncio.run: summary.json says so
    run.summary_extra["command"] = "python -m runs.gpu_scenario " + " ".join(
        sys.argv[1:] if argv is None else argv)
    run.summary_extra["plan"] = dataclasses.asdict(plan)
    run.workload = spec
    # Targets for a tiny model on a GPU (the defaults are sized for the CPU one).
    slo = SLOTargets(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2e_ms=5000.0,
                     after_heal_s=plan.after_heal_s,
                     recovery_bound_s=min(10.0, 0.75 * plan.after_heal_s))
    run.summary_extra["slo"] = dataclasses.asdict(slo)
    error = None
    t0 = time.monotonic()
    try:
        node.start()
        node.wait_ready(240)
        run.progress(f"{node.name} ready in {time.monotonic() - t0:.1f}s: {node.fingerprint()} "
                     f"on {args.device}, grpc {node.grpc_url}")
        asyncio.run(drive(run, node, spec, plan, backend, args.monitor_interval))
        run.check([NoSilentLoss(), LatencySLO(), Goodput(), ErrorRate(), Availability(),
                   Recovery(), RestartReadiness(), CountersMonotonic(), LeakBound(),
                   GpuMemoryBack(), ThrottleExplained()],
                  settings=CheckerSettings(slo=slo, warmup_s=args.warmup))
        phases = gpu_phases(read_history(run_dir.history_path), plan.after_heal_s,
                            warmup_s=args.warmup)
        run.summary_extra["gpu"] = phases
        run.summary_extra["gpu_throttle_effect"] = throttle_effect(phases["phases"])
    except BaseException as e:  # noqa: BLE001 - the summary must say why, then re-raise
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        try:
            node.stop(10)
        finally:
            # Starts made again after a known race, with why (first start and restarts).
            run.summary_extra["node_start_retries"] = node.start_retries
            summary = run.finish(error)
            print(json.dumps({"run_dir": str(run_dir.path), "verdict": summary.get("verdict"),
                              "throttle": summary.get("gpu_throttle_effect")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
