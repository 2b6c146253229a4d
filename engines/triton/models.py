"""The model repository a CPU Triton node serves, written on the spot.

Three Python-backend models, all numpy, so the node starts in seconds and
needs no download (the issue allows a tiny numpy model):

* ``ordeal-tiny``: a decoupled (streaming) byte-level language model: a
  seeded random recurrent net, one response per generated token, spoken over
  gRPC streaming. Greedy output is a pure function of the prompt, so the
  determinism canaries work as on vLLM.
* ``ordeal-tiny-once``: the same model, not decoupled: every token id in one
  response (HTTP ``/v2/models/ordeal-tiny-once/infer``).
* ``ordeal-seq``: a stateful model under Triton's sequence batcher. Each
  step carries its position; the model keeps ``count`` and ``total`` per
  correlation id and answers them with the step it applied. A step out of
  order and a second START for a live sequence are rejected: the server must
  never continue a sequence with state the client did not build.
  ``ordeal-seq-unchecked`` is the same model with those checks off: a real
  server with a real bug, for the test that the sequence invariant fails
  when the server's answer is wrong.

The model code runs inside Triton's Python backend stub, which embeds the
system's libpython and sees only that interpreter's standard library plus
numpy 1.x (see engines/triton/server.py): stdlib and numpy only here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

GENERATE_MODEL = "ordeal-tiny"
ONCE_MODEL = "ordeal-tiny-once"
SEQUENCE_MODEL = "ordeal-seq"
UNCHECKED_SEQUENCE_MODEL = "ordeal-seq-unchecked"
#: Instances per generate model: requests beyond this many queue in Triton
#: (its queue time shows in the statistics and the trace).
INSTANCES = 4

_TINY_LM = '''
import os

import numpy as np


class TinyLM:
    """A seeded byte-level recurrent net: h = tanh(E[b] + W h), logits = h O."""

    def __init__(self, seed=0, hidden=640):
        rng = np.random.default_rng(seed)
        self.E = (rng.standard_normal((256, hidden)) * 0.8).astype(np.float32)
        # Two recurrent layers of 640 in float32, one BLAS thread: ~1.2 ms of
        # CPU per token here, so that taking CPU from a node (gpu_throttle's
        # analog) slows it as it would a real model.
        self.W = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        self.W2 = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        self.O = (rng.standard_normal((hidden, 256)) * 2.0).astype(np.float32)
        self.mask = np.full(256, -1e9)
        self.mask[32:127] = 0.0  # printable ASCII only: every token decodes to text
        self.hidden = hidden

    def generate(self, prompt, max_tokens, temperature):
        h = np.zeros(self.hidden, dtype=np.float32)
        for b in prompt[-48:] or b" ":  # the prompt's last 48 bytes: a bounded prefill
            h = self.step(b, h)
        rng = np.random.default_rng()
        for _ in range(max_tokens):
            logits = h @ self.O + self.mask
            if temperature > 0:
                p = np.exp((logits - logits.max()) / temperature)
                tok = int(rng.choice(256, p=p / p.sum()))
            else:
                tok = int(np.argmax(logits))
            yield tok
            h = self.step(tok, h)

    def step(self, b, h):
        return np.tanh(self.W2 @ np.tanh(self.E[b] + self.W @ h))


NODE = os.environ.get("ORDEAL_NODE", "")  # set by the suite on the server process


def node_tensor(pb_utils, batched=False):
    """Which replica answered, as an output (the x-ordeal-node of vLLM)."""
    arr = np.array([[NODE.encode()]] if batched else [NODE.encode()], dtype=np.object_)
    return pb_utils.Tensor("node", arr)


def scalar(request, name, default, pb_utils):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0].item()
'''

_GENERATE = _TINY_LM + '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: one response per token, then the final flag."""

    def initialize(self, args):
        self.lm = TinyLM()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
                max_tokens = int(scalar(request, "max_tokens", 16, pb_utils))
                temperature = float(scalar(request, "temperature", 0.0, pb_utils))
                for tok in self.lm.generate(bytes(prompt.astype(np.uint8).reshape(-1)),
                                            max_tokens, temperature):
                    out = pb_utils.Tensor("token_id", np.array([tok], dtype=np.int32))
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out, node_tensor(pb_utils)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as e:  # the client must hear why, not hang
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_ONCE = _TINY_LM + '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Every token id in one response."""

    def initialize(self, args):
        self.lm = TinyLM()

    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            toks = list(self.lm.generate(bytes(prompt.astype(np.uint8).reshape(-1)),
                                         int(scalar(request, "max_tokens", 16, pb_utils)),
                                         float(scalar(request, "temperature", 0.0, pb_utils))))
            out = pb_utils.Tensor("token_ids", np.array(toks, dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, node_tensor(pb_utils)]))
        return responses
'''

_SEQUENCE = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils

CHECKED = {checked}


class TritonPythonModel:
    """State per correlation id: [count, total]. Checked: a step must carry
    position == count, and START for a live sequence is refused."""

    def initialize(self, args):
        self.state = {{}}

    def execute(self, requests):
        return [self.step(r) for r in requests]

    def step(self, request):
        def one(name):
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0].item()

        corr, start, end = one("CORRID"), one("START"), one("END")
        value, position = one("value"), one("step")
        live = self.state.get(corr)
        if start:
            if live is not None and CHECKED:
                return self.error(f"sequence {{corr}}: START for a live sequence "
                                  f"({{live[0]}} steps applied); END it first")
            if live is None or CHECKED:
                live = self.state[corr] = [0, 0]
        elif live is None:
            return self.error(f"sequence {{corr}}: step {{position}} for an unknown sequence")
        if CHECKED and position != live[0]:
            return self.error(f"sequence {{corr}}: step {{position}} out of order, "
                              f"expected step {{live[0]}}")
        live[0] += 1
        live[1] += value
        out = [pb_utils.Tensor("count", np.array([[live[0]]], dtype=np.int64)),
               pb_utils.Tensor("total", np.array([[live[1]]], dtype=np.int64)),
               pb_utils.Tensor("applied_step", np.array([[position]], dtype=np.int64)),
               pb_utils.Tensor("node", np.array([[os.environ.get("ORDEAL_NODE", "").encode()]],
                                                dtype=np.object_))]
        if end:
            self.state.pop(corr, None)
        return pb_utils.InferenceResponse(output_tensors=out)

    @staticmethod
    def error(message):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
'''

_GENERATE_IO = '''
input [
  {{ name: "text_input" data_type: TYPE_UINT8 dims: [ -1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "{output}" data_type: TYPE_INT32 dims: [ {dims} ] }},
  {{ name: "node" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
'''

_SEQUENCE_CONFIG = '''
backend: "python"
max_batch_size: 8
sequence_batching {
  # Triton's default releases a sequence idle for 1 s; steps may be seconds apart.
  max_sequence_idle_microseconds: 120000000
  oldest { max_candidate_sequences: 256 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [
  { name: "value" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "step" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [
  { name: "count" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "total" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "applied_step" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "node" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''


def model_files() -> dict[str, str]:
    """Every file of the repository, relative path -> text (pure)."""
    gen_cfg = ('backend: "python"\nmax_batch_size: 0\n'
               "model_transaction_policy { decoupled: true }\n"
               + _GENERATE_IO.format(output="token_id", dims="1", instances=INSTANCES))
    once_cfg = ('backend: "python"\nmax_batch_size: 0\n'
                + _GENERATE_IO.format(output="token_ids", dims="-1", instances=INSTANCES))
    return {
        f"{GENERATE_MODEL}/config.pbtxt": gen_cfg,
        f"{GENERATE_MODEL}/1/model.py": _GENERATE,
        f"{ONCE_MODEL}/config.pbtxt": once_cfg,
        f"{ONCE_MODEL}/1/model.py": _ONCE,
        f"{SEQUENCE_MODEL}/config.pbtxt": _SEQUENCE_CONFIG,
        f"{SEQUENCE_MODEL}/1/model.py": _SEQUENCE.format(checked=True),
        f"{UNCHECKED_SEQUENCE_MODEL}/config.pbtxt": _SEQUENCE_CONFIG,
        f"{UNCHECKED_SEQUENCE_MODEL}/1/model.py": _SEQUENCE.format(checked=False),
    }


def repository_digest() -> str:
    """A hash of every file: the models' identity in fingerprints."""
    h = hashlib.sha256()
    for name, text in sorted(model_files().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:12]


def write_repository(root: Path) -> Path:
    """Write the repository under ``root`` (created; files overwritten)."""
    for rel, text in model_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
