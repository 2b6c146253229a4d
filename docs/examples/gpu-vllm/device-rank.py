"""On the GPU machine, after device-run.sh's install (issue 45): one GPU vLLM
replica started by Ordeal's own node code, then process_pause with
scope="rank:0". Without tensor parallelism vLLM's executor runs rank 0's
worker inside the EngineCore process (no "VLLM::Worker" process), so the
scope must take EngineCore; while it is paused /health must still answer
200 and a completion must not come. Prints one JSON line per step.

    bash docs/examples/gpu-vllm/device-suites.sh rank   (installs, builds the model, runs this)
"""

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from engines.vllm.gpus import GpuPlacement
from engines.vllm.nodes import VllmReplica
from faults.ledger import Ledger
from faults.node_processes import proc_names
from faults.process_pause import ProcessPause
from nodes.ports import free_ports
from ordeal.topology import Endpoint


def say(step: str, **figures) -> None:
    print(json.dumps({"step": step, **figures}), flush=True)


def ask(url: str, completion: bool, timeout: float) -> dict:
    body = json.dumps({"model": "ordeal-tiny", "prompt": "rank probe", "max_tokens": 8,
                       "temperature": 0}).encode() if completion else None
    req = urllib.request.Request(url + ("/v1/completions" if completion else "/health"),
                                 data=body, headers={"content-type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return {"status": r.status, "s": round(time.monotonic() - t0, 3)}
    except (urllib.error.URLError, OSError) as e:
        return {"error": f"{type(e).__name__}: {e}", "s": round(time.monotonic() - t0, 3)}


def main() -> int:
    model = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ordeal-tiny-llama")
    tmp = Path(tempfile.mkdtemp(prefix="rank-"))
    node = VllmReplica("rank-replica", Endpoint("127.0.0.1", free_ports(1)[0]), model,
                       tmp / "replica.log", "rank-run", python=sys.executable,
                       gpu=GpuPlacement("0", 0.3, 0, "device-rank.py"))
    node.start()
    try:
        t0 = time.monotonic()
        node.wait_ready(600)
        url = node.endpoint.url
        say("ready", s=round(time.monotonic() - t0, 1),
            members={p: proc_names(p)[:80] for p in node.pids()})
        say("before", health=ask(url, False, 5), completion=ask(url, True, 30))
        fault = ProcessPause(node, "rank-run", Ledger(tmp / "ledger"), scope="rank:0")
        injected = fault.inject()
        try:
            paused = injected["pids"]
            say("paused", pids=paused, names=[proc_names(p)[:80] for p in paused],
                observe=fault.observe().to_dict())
            say("during", health=ask(url, False, 3), completion=ask(url, True, 3))
        finally:
            healed = fault.heal()
        say("healed", continued=healed["continued"], gone=healed["gone"])
        say("after", health=ask(url, False, 5), completion=ask(url, True, 30))
    finally:
        node.stop(grace=10)
        print((tmp / "replica.log").read_text()[-3000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
