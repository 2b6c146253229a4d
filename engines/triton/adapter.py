"""Triton Inference Server behind the ``Engine`` interface (engines/base.py):
CPU Triton replicas (engines.triton.server) behind HAProxy
(engines.triton.haproxy), driven with tritonclient (engines.triton.client).

Checkers. Every checker that reads what any engine answers applies; five of
vLLM's do not, and are left out rather than reported as vacuous passes:
``stream_wellformed`` and ``usage_matches_tokens`` read OpenAI SSE chunks and
usage blocks (Triton's gRPC stream has neither), ``stream_continuity`` needs a
finish reason the server gave (the Triton client derives its own from the
token count, so a short ``ok`` stream could never be seen), ``no_duplicate_execution``
reads the served journal of vLLM's middleware, and ``health_truthful`` reads
vLLM's running/waiting gauges. ``sequence_consistent`` is Triton's own.

A user's repository (``--triton-model-repo``, engines.triton.user_repo) is
served instead of the generated models and driven through the generate
extension (engines.triton.generate_client); it has no sequence model, so
``sequence_consistent`` and the sequence variant of ``lsn_jump`` are left out.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from types import SimpleNamespace
from typing import Any

from engines.base import ClientCounts, Upstream, trace_files
from engines.triton.client import TritonClient
from engines.triton.generate_client import TritonGenerateClient, model_io
from engines.triton.haproxy import HaproxyRouter
from engines.triton.models import (
    GENERATE_MODEL,
    ONCE_MODEL,
    SEQUENCE_MODEL,
    repository_digest,
    write_repository,
)
from engines.triton.server import MODELS, TritonServerNode
from engines.triton.user_repo import UserRepository, read_user_repository
from engines.vllm.adapter import node_starts
from invariants import (
    Availability,
    CanaryDeterminism,
    CountersMonotonic,
    ErrorRate,
    Failover,
    FaultEffective,
    FaultSLO,
    Goodput,
    LatencySLO,
    LeakBound,
    NodesServeAtEnd,
    NoOrphans,
    NoSilentLoss,
    Recovery,
    RestartReadiness,
    ScheduleLag,
)
from invariants.base import Result
from invariants.sequence import SequenceConsistent
from load.spec import WorkloadSpec
from nodes.local import LocalNode
from ordeal.history.ops import Op
from ordeal.topology import Endpoint

#: Triton's sample names -> the common names (durations are in microseconds).
TRITON_COMMON = {"nv_inference_pending_request_count": "requests_waiting",
                 "nv_inference_request_success_total": "success_total",
                 "nv_inference_request_failure_total": "failure_total",
                 "nv_inference_count_total": "inferences_total",
                 "nv_cpu_memory_used_bytes": "memory_used_bytes"}
#: Fault kinds a CPU Triton node cannot take here, and what was seen.
UNSUPPORTED = {
    "clock_drift": (
        "tritonserver under libfaketime (the only way to move one process's wall clock here "
        "without moving the machine's) stalled: with +3600 s every gRPC stream got all its "
        "tokens but never its final response (timeouts), and stayed so after the heal; with "
        "only the model stubs faked the server crashed. Triton nodes start without "
        "libfaketime; test a Triton node's clock with a real clock step on a machine of its own"),
}
#: Without a GPU, gpu_throttle's analog is a CPU quota on the node; it acts
#: (the processes move into the quota's cgroup) but cannot show on this model.
CPU_THROTTLE_WHY = (
    "no GPU here, and the CPU analog (a CFS quota of 0.4 CPU on the node) does not slow the "
    "numpy models at the suite's load: measured e2e p50 19-25 ms with and without it, the node "
    "using ~7% of a core. On a GPU the co-tenant throttle applies to Triton "
    "(tests/test_gpu_faults.py, the H200 run in docs/examples/gpu-triton-h200)")
#: History ``f`` -> the model that serves it (Ordeal's generated repository).
F_MODEL = {"generate_stream": GENERATE_MODEL, "infer": ONCE_MODEL, "sequence": SEQUENCE_MODEL}
#: Why lsn_jump cannot run on a user's repository.
NO_SEQUENCE_MODEL = (
    "lsn_jump on Triton jumps a correlated sequence of Ordeal's stateful model (ordeal-seq); "
    "a user's repository (--triton-model-repo) is driven through the generate extension and "
    "has no such sequence")


def model_statistics(node: Any, timeout: float = 5.0) -> dict[str, dict[str, int]]:
    """GET /v2/models/stats: per model, success and fail counts and the
    cumulative queue and compute times (ns) since the server started."""
    with urllib.request.urlopen(f"{node.endpoint.url}/v2/models/stats", timeout=timeout) as r:
        stats = json.loads(r.read())
    out = {}
    for m in stats.get("model_stats", []):
        s = m.get("inference_stats", {})
        out[m["name"]] = {"success": s.get("success", {}).get("count", 0),
                          "fail": s.get("fail", {}).get("count", 0),
                          "queue_ns": s.get("queue", {}).get("ns", 0),
                          "compute_infer_ns": s.get("compute_infer", {}).get("ns", 0)}
    return out


class TritonEngine:
    name = "triton"
    served_model_name = GENERATE_MODEL  # the probe asks model_ready_url of Triton nodes
    fingerprint_prefixes = ("triton-", "haproxy-")

    def answer_directly(self, node: Any, timeout: float = 30.0) -> dict[str, Any]:
        if self.user_repo is not None:
            return self._generate_directly(node, timeout)
        prompt = list(b"answer directly")
        body = json.dumps({"inputs": [
            {"name": "text_input", "shape": [len(prompt)], "datatype": "UINT8", "data": prompt},
            {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [4]}]}).encode()
        req = urllib.request.Request(f"{node.endpoint.url}/v2/models/{ONCE_MODEL}/infer",
                                     data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            outs = {o["name"]: o["data"] for o in json.loads(resp.read())["outputs"]}
            return {"status": resp.status, "node": (outs.get("node") or [None])[0],
                    "tokens": len(outs.get("token_ids", []))}

    def _generate_directly(self, node: Any, timeout: float) -> dict[str, Any]:
        """The user's model asked on ``node`` itself, streamed: ``tokens``
        is the number of responses (one per token on an LLM backend)."""
        model = self.served_model_name
        with urllib.request.urlopen(f"{node.endpoint.url}/v2/models/{model}/config",
                                    timeout=timeout) as r:
            inputs, _ = model_io(json.loads(r.read()))
        body = {"text_input": "answer directly", **({"stream": True} if "stream" in inputs
                                                     else {}),
                **({"max_tokens": 4} if "max_tokens" in inputs else {})}
        req = urllib.request.Request(f"{node.endpoint.url}/v2/models/{model}/generate_stream",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            events = [line for line in resp.read().decode().splitlines()
                      if line.startswith("data:") and "text_output" in line]
            return {"status": resp.status, "node": node.name, "tokens": len(events)}

    def settings(self, spec: Any) -> dict[str, Any]:
        """summary.json's ``cluster.stack``: the user's repository when one
        was given, else Ordeal's generated models; HAProxy in front."""
        if self.user_repo is not None:
            return self.user_repo.describe()
        return {"model_repository": "generated (engines/triton/models.py)"}

    def __init__(self, spec: Any = None) -> None:
        # Which sequence model the client drives: tests point it at the
        # unchecked variant (a server with a real bug) to see the invariant fail.
        self.sequence_model = SEQUENCE_MODEL
        repo = getattr(spec, "triton_model_repo", None)
        self.user_repo: UserRepository | None = None
        if repo:
            name = spec.served_model_name
            # The default name is Ordeal's own model's: it names no user model.
            self.user_repo = read_user_repository(
                repo, None if name == GENERATE_MODEL else name)
            self.served_model_name = self.user_repo.model

    def l7_visible(self, f: str) -> bool:
        """HTTP/1.1 requests; gRPC streams are HTTP/2, opaque to L7 toxics
        (a user's model is all HTTP/1.1, streams included)."""
        return self.user_repo is not None or f != "generate_stream"

    def unsupported(self, kind: str) -> str | None:
        if kind == "lsn_jump" and self.user_repo is not None:
            return NO_SEQUENCE_MODEL
        if kind == "gpu_throttle" and not os.path.exists("/dev/nvidiactl"):
            return CPU_THROTTLE_WHY
        return UNSUPPORTED.get(kind)

    def lsn_jump_evidence(self, invariants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A jumped sequence step must be rejected by the server (the checker
        stays valid and counts it as detected); a server that accepted one
        is sequence_consistent's violation, which the verdict shows."""
        return [c for i in invariants if i["name"] == "sequence_consistent"
                for c in i["details"].get("detected_examples", [])]

    def prepare(self, cluster: Any) -> None:
        if self.user_repo is not None:  # served as it is, never copied or changed
            cluster.model = SimpleNamespace(
                name=f"{self.user_repo.model} (the user's Triton repository)",
                path=self.user_repo.path, sha256=self.user_repo.digest)
            return
        repo = write_repository(cluster.log_dir / "models")
        cluster.model = SimpleNamespace(name="ordeal-tiny (numpy, Triton Python backend)",
                                        path=repo, sha256=repository_digest())

    def ports_per_replica(self) -> int:
        return 3  # HTTP, gRPC, metrics

    def replica(self, cluster: Any, index: int, ports: list[int]) -> LocalNode:
        name = f"replica-{index}"
        # No libfaketime: see UNSUPPORTED["clock_drift"].
        user = self.user_repo
        # Ready when the driven model is (the first), and every other one.
        models = MODELS if user is None else (user.model, *(m for m in user.models
                                                            if m != user.model))
        return TritonServerNode(name, Endpoint(cluster.spec.host, ports[0]), ports[1], ports[2],
                                cluster.model.path, cluster.log_dir / f"{name}.log",
                                cluster.cluster_id, models=models,
                                digest=None if user is None else user.digest)

    def upstreams(self, node: Any) -> list[Upstream]:
        return [Upstream("", node.endpoint, "http"), Upstream("-grpc", node.grpc_endpoint, "grpc")]

    def router(self, cluster: Any, endpoint: Endpoint,
               upstreams: list[tuple[str, Upstream, Endpoint]]) -> LocalNode:
        http = [(name, ep) for name, u, ep in upstreams if u.protocol == "http"]
        grpc = [(name, ep) for name, u, ep in upstreams if u.protocol == "grpc"]
        return HaproxyRouter("router", endpoint, http, grpc, cluster.log_dir / "router.log",
                             cluster.cluster_id)

    def client(self, spec: WorkloadSpec, entrypoint: str,
               cluster: Any) -> TritonClient | TritonGenerateClient:
        if self.user_repo is not None:
            return TritonGenerateClient(spec, entrypoint, self.user_repo.model)
        parts = urllib.parse.urlsplit(entrypoint)
        client = TritonClient(spec, f"{parts.hostname}:{parts.port}",
                              getattr(cluster, "sequence_jump_file", None))
        client.sequence_model = self.sequence_model
        return client

    def checkers(self) -> list[Any]:
        common = [NoSilentLoss(), CanaryDeterminism(), LatencySLO(), Goodput(), ErrorRate(),
                  Availability(), Recovery(), RestartReadiness(), ScheduleLag(), Failover(),
                  FaultSLO(), FaultEffective(), NoOrphans(), CountersMonotonic(),
                  LeakBound(), NodesServeAtEnd()]
        return common if self.user_repo is not None else [*common, SequenceConsistent()]

    def f_models(self) -> dict[str, str]:
        """History ``f`` -> the model that served it in this run."""
        if self.user_repo is not None:
            return {"generate": self.user_repo.model, "generate_stream": self.user_repo.model}
        return {**F_MODEL, "sequence": self.sequence_model}

    def collect_metrics(self, node: Any, raw: dict[str, float]) -> dict[str, float]:
        out = {common: raw[name] for name, common in TRITON_COMMON.items() if name in raw}
        if "nv_inference_queue_duration_us_total" in raw:
            out["queue_time_s_total"] = raw["nv_inference_queue_duration_us_total"] / 1e6
        return out

    def fingerprint(self, node: Any) -> str:
        return node.fingerprint()

    def trace(self, op: Op, cluster: Any) -> dict[str, Any]:
        """Triton's own per-request timeline (``--trace-config level=
        TIMESTAMPS``), found by the request id the client sent: queue wait,
        then compute (prefill and decode are one compute span for a Python
        model), in ms. Requests still in the server's buffer (it writes every
        20 traces) are not there yet."""
        rid = op.value.get("request_id")
        if not rid:
            return {"source": "none", "why": "the op has no request_id (pass the invoke op)"}
        for node in cluster.replicas():
            for path in trace_files(node.trace_path):
                found = _find_trace(path, rid)
                if found:
                    return {"source": f"triton trace {path.name}", "node": node.name, **found}
        return {"source": "none", "why": f"request {rid} is in no trace file yet"}

    def mark(self, cluster: Any) -> dict[str, Any]:
        return {node.name: {"starts": node_starts(node), "stats": model_statistics(node)}
                for node in cluster.replicas()}

    def validate_consistency(self, cluster: Any, counts: ClientCounts,
                             mark: dict[str, Any]) -> Result:
        """Triton's model statistics against the client's counts, per model,
        over the load (statistics now minus at ``mark``). The server cannot
        have run more requests than the client sent (ok + unknown + the
        model's own error answers, which Triton counts as executions); when
        no replica restarted it must also have run every one the client got
        an answer to. A restarted replica's statistics began again: it adds
        what its new process ran, and only the upper bound is checked."""
        servers: dict[str, int] = {}
        restarted, problems, bad = [], [], []
        for node in cluster.replicas():
            before = mark.get(node.name) or {"starts": None, "stats": {}}
            same = before["starts"] == node_starts(node)
            if not same:
                restarted.append(node.name)
            try:
                now = model_statistics(node)
            except (OSError, ValueError) as e:
                problems.append(f"{node.name}: /v2/models/stats: {e}")
                continue
            for model, s in now.items():
                base = before["stats"].get(model, {}).get("success", 0) if same else 0
                servers[model] = servers.get(model, 0) + s["success"] - base
        if problems:
            return Result("engine_consistency", "unknown",
                          {"engine": "triton", "why": "statistics unreadable", "problems": problems})
        checked = {}
        by_model: dict[str, list[str]] = {}
        for f, model in self.f_models().items():
            by_model.setdefault(model, []).append(f)
        for model, fs in by_model.items():
            # One model may serve several f (a user's: generate and
            # generate_stream); its statistics count them together.
            c = {"ok": 0, "fail": 0, "info": 0, "model_error": 0}
            for f in fs:
                for k, v in counts.by_f.get(f, {}).items():
                    c[k] = c.get(k, 0) + v
            server = servers.get(model, 0)
            low = 0 if restarted else c["ok"]
            high = c["ok"] + c["info"] + c["model_error"]
            f = "+".join(fs)
            checked[f] = {"model": model, "server_ran": server, "client": c,
                          "bounds": [low, high]}
            if not low <= server <= high:
                bad.append({"f": f, "model": model, "server_ran": server, "client": c,
                            "why": ("the server ran more requests than the client sent"
                                    if server > high else
                                    "the client got answers the server does not count")})
        details = {"engine": "triton", "checked": checked, "restarted": restarted}
        if restarted:
            details["note"] = ("a replica restarted: its statistics began again, so only the "
                               "upper bound is checked")
        return Result("engine_consistency", not bad, details, bad)


def _find_trace(path: Any, rid: str) -> dict[str, Any] | None:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a part being written: the next look finds it
    ids = {e["id"] for e in entries if e.get("request_id") == rid and "id" in e}
    if not ids:
        return None
    stamps: dict[str, int] = {}
    for e in entries:
        if e.get("id") in ids:
            for t in e.get("timestamps", []):
                stamps.setdefault(t["name"], int(t["ns"]))
    ms = lambda a, b: (round((stamps[b] - stamps[a]) / 1e6, 3)  # noqa: E731
                       if a in stamps and b in stamps else None)
    return {"queue_ms": ms("QUEUE_START", "COMPUTE_START"),
            "compute_ms": ms("COMPUTE_START", "COMPUTE_END"),
            "request_ms": ms("REQUEST_START", "REQUEST_END"),
            "timestamps": sorted(stamps, key=stamps.get)}
