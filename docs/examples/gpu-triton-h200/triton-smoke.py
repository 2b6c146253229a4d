import asyncio, time, sys, os
from pathlib import Path
from engines.vllm.model import ensure_tiny_model
from engines.triton.pytriton import TritonNode, send_generate
from load.monitor import sample_node
from ordeal.topology import Endpoint
dev = sys.argv[1]; log = Path(sys.argv[2])
m = ensure_tiny_model()
n = TritonNode("triton-0", Endpoint("127.0.0.1", 18200), 18201, 18202, m.path, log, "smoke", device=dev)
t0 = time.time(); n.start()
try:
    n.wait_ready(120); print("ready", round(time.time() - t0, 1), n.fingerprint(), flush=True)
    async def go():
        res = []
        for t in (0.0, 0.0, 0.7):
            o = await send_generate(n.grpc_url, "the quick brown fox", 16, t, 30)
            print("ONE", o.type, o.error, {k: o.value.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms", "output_tokens", "token_ids")}, flush=True)
            res.append(o.type)
        outs = await asyncio.gather(*[send_generate(n.grpc_url, "alpha beta", 8, 0.0, 30) for _ in range(8)])
        print("CONC", [(o.type, o.value.get("output_tokens"), o.value.get("ttft_ms")) for o in outs], flush=True)
        return all(t == "ok" for t in res) and all(o.type == "ok" for o in outs)
    ok = asyncio.run(go())
    print("SAMPLE", sample_node(n), flush=True)
    print("SMOKE_OK" if ok else "SMOKE_BAD", flush=True)
finally:
    n.stop(5)
