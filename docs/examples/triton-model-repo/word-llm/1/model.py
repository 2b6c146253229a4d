"""word-llm: a word-level stand-in for an LLM behind Triton's generate
extension. Greedy output (temperature 0) is a pure function of the prompt,
so determinism canaries apply; each word takes a few milliseconds, so a
fault can meet a stream in flight. Standard library and numpy only (what
Triton's Python backend stub has here).
"""

import hashlib
import random
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = ("the", "a", "model", "answers", "every", "request", "with", "words", "that",
         "follow", "from", "its", "prompt", "and", "nothing", "else", "so", "two",
         "replicas", "agree", "on", "what", "they", "say", "when", "asked", "twice",
         "under", "faults", "or", "not", "at", "all")
SECONDS_PER_WORD = 0.003


def scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0].item()


def words(prompt, n, temperature):
    seed = int.from_bytes(hashlib.sha256(prompt).digest()[:8], "big")
    rng = random.Random(seed if temperature <= 0 else None)
    for _ in range(n):
        time.sleep(SECONDS_PER_WORD)
        yield " " + rng.choice(WORDS)


def text_tensor(text):
    return pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))


class TritonPythonModel:
    """Each request is answered from its own thread, as an LLM backend's
    engine loop does: ``execute`` returns at once, and the responses leave
    as they are made (sent from inside ``execute``, they all left at its
    end)."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request,), daemon=True).start()
        return None

    def answer(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            prompt = prompt.reshape(-1)[0]
            prompt = prompt if isinstance(prompt, bytes) else str(prompt).encode()
            n = int(scalar(request, "max_tokens", 16))
            temperature = float(scalar(request, "temperature", 0.0))
            if bool(scalar(request, "stream", False)):
                for w in words(prompt, n, temperature):
                    sender.send(pb_utils.InferenceResponse(output_tensors=[text_tensor(w)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                text = "".join(words(prompt, n, temperature))
                sender.send(pb_utils.InferenceResponse(output_tensors=[text_tensor(text)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # the client must hear why, not hang
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
