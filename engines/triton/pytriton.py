"""A Triton Inference Server node (from ``nvidia-pytriton``) serving the tiny
causal LM on a GPU (or the CPU), and the client that drives it.

The node is one labelled process group (nodes.process.ManagedProcess):
``python -m engines.triton.pytriton serve ...`` loads the model with
transformers on ``--device``, binds a decoupled (streaming) Triton model
``ordeal-tiny`` whose Python function generates token by token, and runs the
real ``tritonserver`` binary that pytriton bundles (plus its Python backend
stub). So a process fault (SIGKILL, SIGSTOP) hits the server, the stub and
the model's process together, and faults act on it through the same Node
protocol as on a vLLM replica (``TritonNode`` is a ``LocalNode``).

Clients use Triton's generate extension: ``POST /v2/models/ordeal-tiny/
generate_stream`` with ``{"text_input": [UTF-8 bytes], "max_tokens",
"temperature"}``, one SSE
event per token (``text_output``, ``token_id``), the stream ending when the
model sends its final flag. ``send_generate`` records TTFT, ITL, TPOT and E2E
as ``vllm bench serve`` defines them (load.client._latencies), so the
SLO checkers read these requests as they read vLLM's. Health is
``/v2/health/ready``; metrics (Triton's own, incl. its GPU memory view)
are on the metrics port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any

from load.client import Outcome, _latencies, output_hash
from nodes.local import LocalNode
from nodes.process import REPO_ROOT, ManagedProcess
from nodes.waits import wait_http_ok
from ordeal.history.ops import utc_iso
from ordeal.topology import Endpoint, NodeNotReady

MODEL_NAME = "ordeal-tiny"
#: Triton's metric samples the monitor keeps (label sets summed).
TRITON_SAMPLES = ("nv_inference_request_success_total", "nv_inference_request_failure_total",
                  "nv_inference_count_total", "nv_inference_pending_request_count",
                  "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes",
                  "nv_gpu_utilization", "nv_gpu_power_usage")


def pytriton_missing() -> str | None:
    """None when pytriton can be imported here; else what is missing."""
    try:
        import pytriton.triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken dependency
        return f"nvidia-pytriton is not importable ({type(e).__name__}: {e})"
    return None


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the node. The Python backend stub links the system's
    libpython; the interpreter's own lib dir goes first in LD_LIBRARY_PATH so
    the stub and the interpreter agree (DESIGN.md: the _thread.RLock trap)."""
    env = dict(base if base is not None else os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"})
    return env


def handshake_race(log_lines: list[str]) -> str | None:
    """The reason, when a start failed on PyTriton's handshake race; else None.

    With several instances of a model, instance 0 starts a Unix-socket
    "handshake" server that the others ask for their configuration
    (pytriton/proxy/model.py, proxy/communication.py: ``<model>-config.sock``
    in the workspace). The others wait only for the socket *file*, which
    exists from ``bind()`` on, before the server listens: an instance that
    connects in between gets "connection refused" and the model fails to
    load. Seen on an H200 on a first start right after another server's;
    the same start passed when run again. Nothing of it is left behind (each
    start has a fresh workspace), so starting again is the remedy. Only the
    lines of the last start (after the harness's banner) count.
    """
    last_start = max((i for i, line in enumerate(log_lines)
                      if line.startswith("=== ordeal: start #")), default=-1)
    text = "\n".join(log_lines[last_start + 1:])  # this start's lines only
    if ("get_config_from_handshake_server" in text or "-config.sock" in text) and (
            "ConnectionRefused" in text or "Connection refused" in text):
        return ("PyTriton's handshake race: a model instance asked instance 0's config socket "
                "before it listened (connection refused)")
    return None


class TritonNode(LocalNode):
    """A Triton replica: ``endpoint`` is its HTTP port (KServe v2 API)."""

    metrics_keep = TRITON_SAMPLES
    engine = "triton"

    def __init__(self, name: str, http: Endpoint, grpc_port: int, metrics_port: int,
                 model_dir: Path, log_path: Path, cluster_id: str, device: str = "cuda",
                 instances: int = 2):
        argv = [sys.executable, "-m", "engines.triton.pytriton", "serve",
                "--model", str(model_dir), "--host", http.host,
                "--http-port", str(http.port), "--grpc-port", str(grpc_port),
                "--metrics-port", str(metrics_port), "--device", device,
                "--instances", str(instances)]
        proc = ManagedProcess(name, argv, server_env(), log_path, cluster_id)
        super().__init__(name, "replica", http, proc,
                         hint=f"see {log_path}; the server runs as "
                              f"`python -m engines.triton.pytriton serve ...` (argv in the log)")
        self.device = device
        # Starts that failed on a known race and were made again, each with
        # its reason: the scenario's summary lists them (never hidden).
        self.start_retries: list[dict[str, str]] = []
        self.grpc_url = f"{http.host}:{grpc_port}"
        self.health_url = f"{http.url}/v2/health/ready"
        self.metrics_url = f"http://{http.host}:{metrics_port}/metrics"

    def wait_ready(self, timeout: float) -> None:
        """Ready, or one more start when the first failed on PyTriton's
        handshake race (``handshake_race``), recorded in ``start_retries``."""
        try:
            self._wait_ready_once(timeout)
        except NodeNotReady:
            reason = handshake_race(self.process.log_tail(200))
            if reason is None:
                raise
            self.start_retries.append({"at": utc_iso(), "reason": reason})
            self.process.stop(10)
            self.process.start()
            self._wait_ready_once(timeout)

    def _wait_ready_once(self, timeout: float) -> None:
        wait_http_ok(name=self.name, url=f"{self.health_url}", timeout=timeout,
                     is_running=self.process.is_running, exit_code=self.process.exit_code,
                     log_tail=self.process.log_tail, hint=self.hint)
        wait_http_ok(name=self.name, url=f"{self.endpoint.url}/v2/models/{MODEL_NAME}/ready",
                     timeout=timeout, is_running=self.process.is_running,
                     exit_code=self.process.exit_code, log_tail=self.process.log_tail,
                     hint=self.hint)
        try:
            with urllib.request.urlopen(f"{self.endpoint.url}/v2", timeout=5) as r:
                meta = json.loads(r.read())
            self._fingerprint = f"{meta.get('name', 'triton')}-{meta.get('version', '?')}"
        except (OSError, ValueError):
            pass


async def send_generate(grpc_url: str, prompt: str, max_tokens: int, temperature: float,
                        timeout_s: float, model: str = MODEL_NAME,
                        request_id: str = "", with_node: bool = False) -> Outcome:
    """One streamed generate request over Triton's gRPC streaming API (what a
    decoupled model speaks), classified like load.workload's: a lost
    connection or a timeout is ``info`` (it may have run), an error response
    is ``fail``, a connection refused before sending is ``fail``. Never
    raises but for cancellation. (Triton 2.51's HTTP generate_stream refused
    every output of this model, "output tensor shape does not match size of
    output", and passes a JSON string to a BYTES input without its length
    prefix: gRPC it is.)"""
    import grpc
    import numpy as np
    import tritonclient.grpc.aio as tc
    from tritonclient.utils import InferenceServerException

    start = time.monotonic_ns()
    times: list[int] = []
    ids: list[int] = []
    prompt_bytes = np.frombuffer(prompt.encode(), dtype=np.uint8)
    inputs = [tc.InferInput("text_input", [len(prompt_bytes)], "UINT8"),
              tc.InferInput("max_tokens", [1], "INT32"),
              tc.InferInput("temperature", [1], "FP32")]
    inputs[0].set_data_from_numpy(prompt_bytes)
    inputs[1].set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([temperature], dtype=np.float32))

    async def requests():
        outputs = [tc.InferRequestedOutput("token_id")] + (
            [tc.InferRequestedOutput("node")] if with_node else [])
        yield {"model_name": model, "inputs": inputs, "request_id": request_id,
               "outputs": outputs,
               "enable_empty_final_response": True}

    # A subchannel of its own: gRPC shares subchannels across a process's
    # channels, and one reset during a fault left the shared one in backoff,
    # failing new requests after the heal with UNAVAILABLE (seen).
    client = tc.InferenceServerClient(url=grpc_url,
                                      channel_args=[("grpc.use_local_subchannel_pool", 1)])
    final = False
    node: str | None = None  # the replica that answered (the model's "node" output)
    try:
        async def consume() -> Outcome | None:
            nonlocal final, node
            async for result, error in client.stream_infer(inputs_iterator=requests()):
                now = time.monotonic_ns()
                if error is not None:
                    return _grpc_error(error, len(ids))
                resp = result.get_response()
                out = result.as_numpy("token_id")
                if node is None and with_node:
                    raw = result.as_numpy("node")
                    if raw is not None and raw.size:
                        v = raw.reshape(-1)[0]
                        node = v.decode() if isinstance(v, bytes) else str(v)
                if out is not None and out.size and int(out.reshape(-1)[0]) >= 0:
                    times.append(now)
                    ids.append(int(out.reshape(-1)[0]))
                p = resp.parameters.get("triton_final_response")
                if p is not None and p.bool_param:
                    final = True
                    return None
            return None

        bad = await asyncio.wait_for(consume(), timeout_s)
        if bad is not None:
            return bad
    except asyncio.TimeoutError:
        return Outcome("info", {"output_tokens": len(ids)},
                       f"timeout after {timeout_s}s ({len(ids)} tokens streamed)")
    except (InferenceServerException, grpc.RpcError) as e:
        return _grpc_error(e, len(ids))
    finally:
        try:
            await client.close()
        except Exception:  # noqa: BLE001 - closing a broken channel
            pass
    end = time.monotonic_ns()
    value = {"status": "grpc-ok", **({"node": node} if node else {}), "output_tokens": len(ids),
             "output_hash": output_hash(",".join(map(str, ids))),  # of the token ids
             "finish_reason": "length" if len(ids) >= max_tokens else "stop",
             **_latencies(start, end, times, len(ids))}
    if temperature == 0:
        value["token_ids"] = ids
    # The stream closes once the server has sent every response of the request
    # (a cut stream raises above instead); pytriton 0.7 did not flag the last
    # one with triton_final_response on the H200, so both ends count as complete.
    value["final_flag"] = final
    if not ids:
        return Outcome("fail", value, "stream ended without a token")
    return Outcome("ok", value)


def _grpc_error(e: Any, tokens: int) -> Outcome:
    """Classify a gRPC failure (grpc's AioRpcError or tritonclient's
    InferenceServerException): refused before it ran -> ``fail`` (no
    connection could be made; the model is not loaded, e.g. while the node
    restarts); anything cut once sent -> ``info`` (it may have run)."""
    if hasattr(e, "code") and callable(e.code):  # grpc.aio.AioRpcError
        code, msg = str(e.code()), str(e.details())
    else:
        code, msg = str(getattr(e, "status", lambda: None)()), str(e.message()
                                                                   if hasattr(e, "message")
                                                                   else e)
    msg = msg[:300]
    value = {"status": code, "output_tokens": tokens}
    low = msg.lower()
    if tokens == 0 and "UNAVAILABLE" in code and ("failed to connect" in low
                                                  or "connection refused" in low):
        return Outcome("fail", value, f"connect failed (request not sent): {msg}")
    if tokens == 0 and ("unknown model" in low or "NOT_FOUND" in code
                        or "INVALID_ARGUMENT" in code):
        return Outcome("fail", value, f"refused by the server: {msg}")
    return Outcome("info", value, f"stream lost: {code}: {msg}")


# --- the server (runs inside the node process) ---------------------------------

def serve(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(args.device)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).to(device).eval()
    eos = tok.eos_token_id

    @torch.inference_mode()
    def tokens(prompt: str, max_tokens: int, temperature: float):
        ids = tok(prompt, return_tensors="pt").input_ids.to(device)
        past, cur = None, ids
        for _ in range(max_tokens):
            out = model(input_ids=cur, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            tid = int(nxt)
            yield tid, ""
            if tid == eos:
                return
            cur = nxt

    def first(r: Any, name: str, default: Any) -> Any:
        try:
            a = r[name]  # pytriton's Request: a mapping without .get
        except KeyError:
            return default
        v = np.asarray(a).reshape(-1)[0]
        return v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v

    def prompt_text(r: Any) -> str:
        return np.asarray(r["text_input"], dtype=np.uint8).tobytes().decode("utf-8", "replace")

    def infer(requests: list[Any]):
        """Decoupled: each yield answers every request of the call once;
        requests that already finished get token_id -1 (clients skip it)."""
        streams = [tokens(prompt_text(r), int(first(r, "max_tokens", 16)),
                          float(first(r, "temperature", 0.0))) for r in requests]
        live = [True] * len(streams)
        while any(live):
            batch = []
            for i, s in enumerate(streams):
                tid, piece = -1, ""
                if live[i]:
                    try:
                        tid, piece = next(s)
                    except StopIteration:
                        live[i] = False
                batch.append({"token_id": np.array([tid], dtype=np.int32)})
            if any(b["token_id"][0] >= 0 for b in batch):
                yield batch

    config = TritonConfig(http_address=args.host, http_port=args.http_port,
                          grpc_address=args.host, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, log_verbose=0)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL_NAME, infer_func=[infer] * args.instances,
            # The prompt travels as UTF-8 bytes in a UINT8 tensor: Triton 2.51's generate
            # extension hands a JSON string to a BYTES input without the 4-byte length
            # prefix, and the Python backend stub then dies (seen: "unpack_from requires
            # a buffer of at least 320017175 bytes").
            inputs=[Tensor(name="text_input", dtype=np.uint8, shape=(-1,)),
                    Tensor(name="max_tokens", dtype=np.int32, shape=(1,)),
                    Tensor(name="temperature", dtype=np.float32, shape=(1,), optional=True)],
            # Token ids only: the generate extension turns each output into one JSON
            # value and refused a text output ("output tensor shape does not match
            # size of output"), both as BYTES and as UINT8 bytes.
            outputs=[Tensor(name="token_id", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True), strict=False)
        print(f"ordeal triton: model {MODEL_NAME} on {device} "
              f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
              f"{args.instances} instance(s), http {args.host}:{args.http_port}", flush=True)
        triton.serve()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m engines.triton.pytriton")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the tiny LM through Triton (blocks)")
    s.add_argument("--model", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--http-port", type=int, required=True)
    s.add_argument("--grpc-port", type=int, required=True)
    s.add_argument("--metrics-port", type=int, required=True)
    s.add_argument("--device", default="cuda")
    s.add_argument("--instances", type=int, default=2)
    args = p.parse_args(argv)
    serve(args)


if __name__ == "__main__":
    main()
