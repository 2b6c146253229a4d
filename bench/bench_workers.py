"""Item 2 of the performance issue: the load from several processes.

Ordeal's client (bench/load_clients.py, a real History) with one load
worker on one core against two workers on two cores, on the same rate
ladder (16-token streams at 10 ms ITL, steady arrivals), alternating which
goes first at each step. The highest rate each sustains (bench_load's
``sustained``: every request ok, 95% of the rate, lags small, and not
CPU-bound: the client's CPU share of its cores under 0.9) gives the
scaling: two workers / one worker.

The bench SSE server must not be the limit: it runs as several processes on
one port (SO_REUSEPORT), pinned to cores the clients do not use when the
machine has them (``--server-cores``). On a 2-core machine the server
shares the clients' cores and the figure says more about the server than
the workers; run it where there are at least 2 + 2 cores.

    python -m bench.bench_workers [--quick] [--server-cores 2,3,4,5]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_load import CPU_BOUND, LAG_P50_MS, sustained
from bench.common import PY, Child, machine, progress, r, write_json

RATES_QUICK = [200, 400, 600, 800]
RATES_FULL = [200, 400, 600, 700, 800, 900, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1800]
TOKENS, ITL_MS = 16, 10.0


def start_servers(cores: list[int], tmp: Path) -> tuple[list[Child], int]:
    """One bench SSE server per core in ``cores`` (or two unpinned), all on
    one port."""
    argv = [PY, "-m", "bench.sse_server", "--itl-ms", str(ITL_MS), "--reuse-port"]
    pins = cores or [None, None]
    first = Child(argv + (["--cpu", str(pins[0])] if pins[0] is not None else []),
                  tmp / "server-0.log")
    port = int(first.wait_line("READY").split()[1])
    servers = [first]
    for i, core in enumerate(pins[1:], 1):
        child = Child(argv + ["--port", str(port)] + (["--cpu", str(core)] if core is not None
                                                       else []), tmp / f"server-{i}.log")
        child.wait_line("READY")
        servers.append(child)
    return servers, port


def one(url: str, tmp: Path, rate: int, workers: int, cpus: list[int],
        duration: float) -> dict[str, Any]:
    out = tmp / f"w{workers}-{rate}-{time.monotonic_ns()}.json"
    argv = [PY, "-m", "bench.load_clients", "ordeal", "--url", url, "--rate", str(rate),
            "--duration", str(duration), "--tokens", str(TOKENS), "--itl-ms", str(ITL_MS),
            "--workers", str(workers), "--cpus", ",".join(map(str, cpus)), "--out", str(out)]
    child = Child(argv, tmp / f"w{workers}.log")
    rc = child.proc.wait()
    if rc != 0 or not out.exists():
        return {"error": f"exit {rc}; see {tmp / f'w{workers}.log'}", "rate": rate}
    res = json.loads(out.read_text())
    res["cpu_share_total"] = res["cpu_share"]
    res["cpu_share"] = r(res["cpu_share"] / len(cpus), 2)  # of the cores it was given
    ok, why = sustained(res, rate)
    res["sustained"], res["why_not"] = ok, why
    return res


def run(quick: bool = False, server_cores: list[int] | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-workers-"))
    cores = sorted(os.sched_getaffinity(0))
    server_cores = server_cores if server_cores is not None else (
        cores[2:6] if len(cores) >= 4 else [])
    client_cores = [c for c in cores if c not in server_cores][:2]
    if len(client_cores) < 2:
        raise SystemExit("bench_workers: needs 2 cores for the clients")
    duration = 4.0 if quick else 6.0
    rates = RATES_QUICK if quick else RATES_FULL
    configs = {"1 worker": (1, client_cores[:1]), "2 workers": (2, client_cores[:2])}
    servers, port = start_servers(server_cores, tmp)
    url = f"http://127.0.0.1:{port}"
    progress(f"workers: rate ladder {rates}, {TOKENS} tokens at {ITL_MS:g} ms ITL, "
             f"{duration:g} s per step; clients on cores {client_cores}, "
             f"{len(servers)} servers on " + (f"cores {server_cores}" if server_cores
                                               else "any core (shared with the clients)"))
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    failed = {k: 0 for k in configs}
    try:
        for i, rate in enumerate(rates):
            order = list(configs) if i % 2 == 0 else list(reversed(configs))
            for name in order:
                if failed[name] >= 2:
                    continue  # two steps in a row not sustained (each tried twice)
                workers, cpus = configs[name]
                res = one(url, tmp, rate, workers, cpus, duration)
                if "error" not in res and not res["sustained"]:
                    again = one(url, tmp, rate, workers, cpus, duration)
                    again["first_try"] = res
                    res = again
                res["step"] = rate
                runs[name].append(res)
                if "error" in res:
                    progress(f"workers {rate:>5}: {name} failed: {res['error']}")
                    failed[name] = 2
                    continue
                failed[name] = 0 if res["sustained"] else failed[name] + 1
                progress(f"workers {rate:>5}: {name:9} ok {res['ok']}/{res['sent']} "
                         f"{res['achieved_rps']:7.1f} req/s, dispatch lag p50 "
                         f"{res['dispatch_lag_ms']['p50']} ms, chunk lag p50 "
                         f"{res['chunk_lag_ms']['p50']} ms, CPU {res['cpu_share']:.2f} of "
                         f"{len(cpus)} core(s)"
                         + ("" if res["sustained"] else f"  NOT sustained: {res['why_not']}"))
    finally:
        for s in servers:
            s.stop()
    best = {k: max((x["step"] for x in v if x.get("sustained")), default=None)
            for k, v in runs.items()}
    one_w, two_w = best["1 worker"], best["2 workers"]
    out = {"tokens": TOKENS, "itl_ms": ITL_MS, "duration_s": duration, "rates": rates,
           "client_cores": client_cores, "server_cores": server_cores,
           "servers": len(servers), "lag_p50_limit_ms": LAG_P50_MS, "cpu_bound": CPU_BOUND,
           "cores_on_machine": os.cpu_count(), "machine": machine(), "max_sustained": best,
           "scaling": r(two_w / one_w, 2) if one_w and two_w else None, "runs": runs}
    write_json("workers", out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--server-cores", default=None,
                    help="cores for the SSE servers, e.g. 2,3,4,5 (default: cores 2-5 when "
                         "there are 4 or more, else unpinned)")
    a = ap.parse_args()
    sc = [int(c) for c in a.server_cores.split(",")] if a.server_cores else None
    res = run(a.quick, sc)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=2))
