"""Ordeal's client on asyncio's event loop against the same client on uvloop,
side by side in one run (issue 26 part 3: "an event loop such as uvloop where
it measurably helps").

The bench SSE server runs on core 1, the client (``bench.load_clients
ordeal``) on core 0, one client process at a time, the two loops alternating
which goes first in each pair. Two steps, the two ladders of
``bench_load``: a rate step (open loop, 16-token streams at 10 ms ITL) and a
streams step (a closed loop of concurrent streams, 40 tokens at 50 ms ITL).
The figures that decide are the client's CPU per chunk and its chunk lag
(when the client recorded a chunk minus when the server wrote it), as ratios
uvloop / asyncio per pair; absolute figures move with the machine's load.

    python -m bench.bench_loop [--pairs 3] [--duration 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PY, Child, progress, r, start_sse_server, write_json

STEPS = (  # (name, ladder args, tokens, itl_ms)
    ("rate 400 req/s", ["--rate", "400"], 16, 10.0),
    ("streams 256", ["--concurrency", "256"], 40, 50.0),
)
LOOPS = ("asyncio", "uvloop")


def one(loop: str, url: str, args: list[str], tokens: int, itl_ms: float, duration: float,
        tmp: Path) -> dict[str, Any]:
    out = tmp / f"{loop}-{time.monotonic_ns()}.json"
    child = Child([PY, "-m", "bench.load_clients", "ordeal", "--url", url, "--duration",
                   str(duration), "--tokens", str(tokens), "--itl-ms", str(itl_ms),
                   "--cpu", "0", "--loop", loop, *args, "--out", str(out)],
                  tmp / f"{loop}.log")
    rc = child.proc.wait()
    if rc != 0 or not out.exists():
        raise RuntimeError(f"the {loop} client exited {rc}; see {tmp / f'{loop}.log'}")
    res = json.loads(out.read_text())
    return {k: res[k] for k in ("ok", "achieved_rps", "chunks", "cpu_share",
                                "cpu_us_per_chunk", "chunk_lag_ms", "dispatch_lag_ms")}


def run(pairs: int = 3, duration: float = 8.0) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-loop-"))
    out: dict[str, Any] = {"pairs": pairs, "duration_s": duration,
                           "pinned": "client on core 0, server on core 1", "steps": {}}
    for name, args, tokens, itl in STEPS:
        server, port = start_sse_server(itl, cpu=1, log=tmp / "server.log")
        runs: dict[str, list[dict[str, Any]]] = {loop: [] for loop in LOOPS}
        ratios: dict[str, list[float]] = {"cpu_us_per_chunk": [], "chunk_lag_p50": [],
                                          "chunk_lag_p99": []}
        try:
            for i in range(pairs):
                order = LOOPS if i % 2 == 0 else LOOPS[::-1]
                got = {}
                for loop in order:
                    got[loop] = one(loop, f"http://127.0.0.1:{port}", args, tokens, itl,
                                    duration, tmp)
                    runs[loop].append(got[loop])
                    progress(f"loop: {name}, pair {i + 1}/{pairs}, {loop}: "
                             f"{got[loop]['cpu_us_per_chunk']} us CPU per chunk, chunk lag "
                             f"p50 {got[loop]['chunk_lag_ms']['p50']} ms, p99 "
                             f"{got[loop]['chunk_lag_ms']['p99']} ms, "
                             f"{got[loop]['achieved_rps']} req/s ok")
                a, u = got["asyncio"], got["uvloop"]
                ratios["cpu_us_per_chunk"].append(u["cpu_us_per_chunk"] / a["cpu_us_per_chunk"])
                for q in ("p50", "p99"):
                    if a["chunk_lag_ms"][q]:
                        ratios[f"chunk_lag_{q}"].append(u["chunk_lag_ms"][q]
                                                        / a["chunk_lag_ms"][q])
        finally:
            server.stop()
        out["steps"][name] = {
            "tokens": tokens, "itl_ms": itl, "runs": runs,
            "uvloop_over_asyncio": {k: {"median": r(statistics.median(v)) if v else None,
                                        "per_pair": [r(x) for x in v]}
                                    for k, v in ratios.items()}}
    write_json("loop", out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0)
    a = ap.parse_args()
    res = run(a.pairs, a.duration)
    print(json.dumps({k: v["uvloop_over_asyncio"] for k, v in res["steps"].items()}, indent=2))
