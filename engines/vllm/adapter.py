"""vLLM behind the ``Engine`` interface (engines/base.py): real vLLM
replicas (engines.vllm.nodes) behind the real vllm-router, spoken to over
the OpenAI API."""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.request
from typing import Any

from engines.base import ClientCounts, Upstream
from engines.vllm.cpus import replica_cpus
from engines.vllm.gpus import (
    detect_build,
    parse_replica_gpus,
    plan_gpus,
    start_waves,
    tensor_parallel_size,
)
from engines.vllm.model import ensure_tiny_model, resolve_model
from engines.vllm.nodes import (
    ORDEAL_ENGINE_DEFAULTS,
    ORDEAL_GPU_ENGINE_DEFAULTS,
    ROUTER_PROFILES,
    SERVED_MODEL_NAME,
    ReplicaConfig,
    VllmReplica,
    VllmRouter,
    replica_env,
)
from invariants import DEFAULT_CHECKERS
from invariants.base import Result
from load.client import OpenAIClient
from load.metrics import fetch_metrics
from load.spec import WorkloadSpec
from nodes.local import LocalNode
from nodes.ports import free_ports
from ordeal.config import ConfigError, redact_argv, redact_env
from ordeal.history.ops import Op
from ordeal.topology import Endpoint
from ordeal.workers import visible_gpus

#: vLLM's sample names -> the common names.
VLLM_COMMON = {"vllm:num_requests_running": "requests_running",
               "vllm:num_requests_waiting": "requests_waiting",
               "vllm:request_queue_time_seconds_sum": "queue_time_s_total",
               "vllm:request_success_total": "success_total",
               "vllm:kv_cache_usage_perc": "kv_cache_usage",
               "process_resident_memory_bytes": "memory_used_bytes",
               "vllm:prompt_tokens_total": "prompt_tokens_total",
               "vllm:generation_tokens_total": "generation_tokens_total"}


def node_starts(node: Any) -> Any:
    """What tells one start of a node's process from the next (None: not
    known): how many times it was started (a local process), or when its
    container last started (a Docker node's ``starts``). Only compared
    for equality: a change means its counters began again."""
    proc = getattr(node, "process", None)
    if proc is not None:
        return getattr(proc, "starts", None)
    return getattr(node, "starts", None)


def prepare_model(spec: Any, progress: Any) -> Any:
    """The model every replica serves: the user's (``--model``, resolved,
    never downloaded) or the tiny one made here. Every backend calls this."""
    if spec.model:
        model = resolve_model(spec.model)
        progress(f"model {spec.model} ({model.source}: {model.path})")
        return model
    progress(f"preparing the tiny model (seed {spec.model_seed}) ...")
    return ensure_tiny_model(spec.model_seed)


def place_replicas(cluster: Any) -> None:
    """The build the replicas run (engines/vllm/gpus.py) and, for the GPU
    build, each replica's GPU: set on the cluster (``vllm_build``,
    ``gpu_plan``) and recorded in ``cluster.stack`` (``stack_extra``) as
    settings Ordeal chose."""
    spec = cluster.spec
    build = detect_build(getattr(spec, "vllm_python", None))
    cluster.vllm_build = build
    cluster.gpu_plan = None
    cluster.start_waves = None  # None: every replica at once
    extra: dict[str, Any] = {"vllm_build": build.describe()}
    if build.gpu:
        plan = plan_gpus(spec.replicas, build.gpus, parse_replica_gpus(spec.replica_gpus),
                         tensor_parallel_size(spec.engine_args))
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        outer = list(range(build.gpus)) if env is None else visible_gpus(env, 1 << 16)
        if len(outer) < build.gpus:
            raise ConfigError(f"CUDA_VISIBLE_DEVICES={env!r}: Ordeal places replicas by GPU "
                              "index and cannot read this list (UUIDs or MIG ids); give "
                              "indices, e.g. CUDA_VISIBLE_DEVICES=0,1")
        # An index is one of the harness's own visible GPUs (an xdist worker's).
        cluster.gpu_plan = [dataclasses.replace(
            p, visible=",".join(str(outer[d]) for d in p.rank_devices)) for p in plan]
        cluster.start_waves = start_waves(cluster.gpu_plan)
        gpu_env = replica_env({}, gpu=cluster.gpu_plan[0])
        extra.update({
            "ordeal_engine_flags": list(ORDEAL_GPU_ENGINE_DEFAULTS),
            "ordeal_engine_env": {k: v for k, v in gpu_env.items()
                                  if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")
                                  and k not in dict(spec.engine_env)},
            "replica_gpus": {f"replica-{i}": dataclasses.asdict(p)
                             for i, p in enumerate(cluster.gpu_plan)},
            "replica_cpus": "not applied: GPU replicas are placed by CUDA_VISIBLE_DEVICES",
            "replica_start": ("at once" if len(cluster.start_waves) == 1 else
                              "one replica per GPU at a time (replicas sharing a GPU one after "
                              "the other): " + " then ".join(
                                  ",".join(f"replica-{i}" for i in wave)
                                  for wave in cluster.start_waves))})
        cluster.progress(f"vLLM {build.version} (GPU build, {build.gpus} GPU(s) visible): "
                         + "; ".join(f"replica-{i} on GPU {p.visible}"
                                     + (f" with --gpu-memory-utilization "
                                        f"{p.memory_utilization:g}"
                                        if p.memory_utilization is not None else "")
                                     for i, p in enumerate(cluster.gpu_plan)))
    cluster.stack_extra = extra


class VllmEngine:
    name = "vllm"
    fingerprint_prefixes = ("vllm-", "vllm-router-")

    def __init__(self, spec: Any = None):
        # What /v1/models lists, and what every request names.
        self.served_model_name = (spec.served_model_name if spec is not None
                                  else SERVED_MODEL_NAME)

    def settings(self, spec: Any) -> dict[str, Any]:
        """Every setting of the stack, who chose it, for summary.json
        (``cluster.stack``): the user's, and the ones Ordeal added."""
        config = ReplicaConfig.of(spec)
        return {
            "served_model_name": config.served_model_name,
            "max_model_len": config.max_model_len,
            "tokenizer": config.tokenizer,
            "engine_args": redact_argv(config.engine_args),
            "engine_env": redact_env(config.engine_env),
            "ordeal_engine_flags": list(ORDEAL_ENGINE_DEFAULTS),
            # Set by Ordeal on every replica (besides one compute core each,
            # VLLM_CPU_OMP_THREADS_BIND, and libfaketime's variables when
            # clock faults are on); --engine-env wins over them.
            "ordeal_engine_env": {k: v for k, v in replica_env({}).items()
                                  if k != "PYTHONPATH" and k not in dict(config.engine_env)},
            "replica_cpus": spec.replica_cpus,  # each node's cores: cluster.nodes[].cpus
            "router_profile": spec.router_profile,
            "router_profile_flags": list(ROUTER_PROFILES[spec.router_profile]),
            "router_args": redact_argv(spec.router_args),
        }

    def answer_directly(self, node: Any, timeout: float = 30.0) -> dict[str, Any]:
        body = json.dumps({"model": self.served_model_name, "prompt": "answer directly",
                           "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(node.endpoint.url + "/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = json.loads(resp.read())
            return {"status": resp.status, "node": resp.headers.get("x-ordeal-node"),
                    "tokens": payload.get("usage", {}).get("completion_tokens")}

    def l7_visible(self, f: str) -> bool:
        return True  # the OpenAI API is HTTP/1.1 end to end

    def unsupported(self, kind: str) -> str | None:
        return None  # every kind of the catalogue acts on vLLM replicas

    def lsn_jump_evidence(self, invariants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A rewritten stream is a defect the stream checkers must call out:
        their counterexamples are the evidence."""
        return [c for i in invariants
                if i["name"] in ("stream_wellformed", "usage_matches_tokens")
                and i["valid"] is False for c in i["counterexamples"]]

    def prepare(self, cluster: Any) -> None:
        if cluster.model is None:
            cluster.model = prepare_model(cluster.spec, cluster.progress)
        if getattr(cluster, "vllm_build", None) is None:
            place_replicas(cluster)

    def ports_per_replica(self) -> int:
        return 1

    def replica(self, cluster: Any, index: int, ports: list[int]) -> LocalNode:
        cpus = replica_cpus(sorted(os.sched_getaffinity(0)), cluster.spec.replicas, index,
                            cluster.spec.replica_cpus)
        name = f"replica-{index}"
        gpus = getattr(cluster, "gpu_plan", None)
        return VllmReplica(name, Endpoint(cluster.spec.host, ports[0]), cluster.model.path,
                           cluster.log_dir / f"{name}.log", cluster.cluster_id,
                           cpu_core=cpus.compute, cpus=cpus.allowed,
                           clock_file=(cluster.log_dir / f"{name}.faketime"
                                       if cluster.spec.clock_faults else None),
                           config=ReplicaConfig.of(cluster.spec),
                           python=cluster.vllm_build.python if cluster.vllm_build else None,
                           gpu=gpus[index] if gpus else None)

    def upstreams(self, node: LocalNode) -> list[Upstream]:
        return [Upstream("", node.endpoint)]

    def router(self, cluster: Any, endpoint: Endpoint,
               upstreams: list[tuple[str, Upstream, Endpoint]]) -> LocalNode:
        metrics_port = next(p for p in free_ports(2, cluster.spec.host) if p != endpoint.port)
        return VllmRouter("router", endpoint, [ep.url for _, _, ep in upstreams],
                          cluster.log_dir / "router.log", cluster.cluster_id,
                          metrics_port=metrics_port, profile=cluster.spec.router_profile,
                          extra_args=cluster.spec.router_args,
                          python=getattr(cluster.spec, "vllm_python", None))

    def client(self, spec: WorkloadSpec, entrypoint: str, cluster: Any) -> OpenAIClient:
        # An external deployment's headers, API key variable and TLS.
        return OpenAIClient(spec, entrypoint, getattr(cluster, "client_options", None))

    def checkers(self) -> list[Any]:
        return [c() for c in DEFAULT_CHECKERS]

    def collect_metrics(self, node: Any, raw: dict[str, float]) -> dict[str, float]:
        out = {common: raw[name] for name, common in VLLM_COMMON.items() if name in raw}
        return out

    def fingerprint(self, node: Any) -> str:
        return node.fingerprint()

    def trace(self, op: Op, cluster: Any) -> dict[str, Any]:
        """vLLM publishes per-request phases only as histograms, so the
        timeline is the client's own: queue + prefill until the first token,
        decode after it."""
        v = op.value
        if "ttft_ms" not in v or "e2e_ms" not in v:
            return {"source": "none", "why": "the op has no token timings (not ok, or no token)"}
        return {"source": "client timings (vLLM gives per-request phases only as histograms)",
                "queue_and_prefill_ms": v["ttft_ms"],
                "decode_ms": round(v["e2e_ms"] - v["ttft_ms"], 3),
                "e2e_ms": v["e2e_ms"], "node": v.get("node")}

    def mark(self, cluster: Any) -> dict[str, Any]:
        out = {}
        for node in cluster.replicas():
            raw, err = fetch_metrics(node)
            out[node.name] = {"starts": node_starts(node), "error": err,
                              "success": raw.get("vllm:request_success_total", 0.0)}
        return out

    def validate_consistency(self, cluster: Any, counts: ClientCounts,
                             mark: dict[str, Any]) -> Result:
        """Each replica that ran the whole load in one process must have
        finished at least as many requests during it as the client got
        answers from it (the router may retry, and a probe may add one, so
        more is fine; fewer means vLLM's counter or the node header lies)."""
        checked, skipped, bad = {}, {}, []
        for node in cluster.replicas():
            before = mark.get(node.name) or {}
            starts = node_starts(node)
            if starts is None or before.get("starts") != starts or before.get("error"):
                skipped[node.name] = before.get("error") or (
                    f"restarted during the load (start {before.get('starts')} -> {starts}): its "
                    "counters began again" if starts is not None else "no process count")
                continue
            raw, err = fetch_metrics(node)
            if err:
                skipped[node.name] = err
                continue
            server = raw.get("vllm:request_success_total", 0.0) - before["success"]
            client = counts.by_node.get(node.name, 0)
            checked[node.name] = {"server_success": server, "client_ok": client}
            if server < client:
                bad.append({"node": node.name, "server_success": server, "client_ok": client,
                            "why": "the client got more answers from this replica than it "
                                   "says it finished"})
        valid: Any = (not bad) if checked else "unknown"
        return Result("engine_consistency", valid,
                      {"engine": "vllm", "checked": checked, "not_checked": skipped}, bad)
