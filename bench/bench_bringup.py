"""Item 5 of the performance issue: cluster bring-up for N = 1, 2, 3 replicas.

The embedded real cluster (clusters/local.py: N vLLM replicas spawned
together and waited in parallel, the fault proxy, vllm-router), started and
stopped once per N, in the order 1, 2, 3 (full: then N=1 again, whose two
starts bracket the others, against a trend in the machine's load). Two figures per start: replicas
ready (the last replica answers /health and a one-token completion) and
cluster ready (router too), the fastest of an N's starts counting (the
neighbours on a shared machine only add time); and the CPU seconds the replicas' process trees
used to get there (the work: on 2 cores, 3 replicas cannot do 3x the work in
the time of one). Each is read as a ratio to N = 1's. The model is
cached (engines/vllm/model.py) before the first start, so every N reads the same
files. One cluster at a time: at most three replicas (~9 GB) are up.

    python -m bench.bench_bringup [--quick] [--sizes 1 2 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, progress, r, write_json

GOAL_RATIO_3 = 1.5  # "about the time of one": 3 replicas within 1.5x of one


def start_once(n: int, tmp: Path) -> dict[str, Any]:
    from clusters.local import LocalCluster
    from engines.vllm.model import ensure_tiny_model
    from ordeal.config import ClusterSpec

    model = ensure_tiny_model(0)
    run_id = f"bench-bringup-{uuid.uuid4().hex[:6]}"
    marks: dict[str, float] = {}
    t0 = time.monotonic()

    def note(msg: str) -> None:
        if " ready (" in msg and msg.startswith("replica-"):
            marks[msg.split()[0]] = time.monotonic() - t0
        progress(f"bring-up N={n}: {msg}")

    cluster = LocalCluster(ClusterSpec(replicas=n), run_id, tmp / f"n{n}-{run_id}", note, model)
    cpu = None
    try:
        cluster.start()
        total = time.monotonic() - t0
        # CPU seconds the replicas' process trees spent to get ready: the
        # work, which on 2 cores N replicas cannot do in the time of one.
        cpu = 0.0
        for node in cluster.replicas():
            for pid in node.pids():
                try:
                    cpu += cpu_seconds(pid)
                except OSError:
                    pass
    finally:
        cluster.stop()
    replicas = max(marks.values()) if marks else None
    return {"n": n, "replicas_ready_s": r(replicas, 2), "cluster_ready_s": r(total, 2),
            "each_replica_s": {k: r(v, 2) for k, v in sorted(marks.items())},
            "replicas_cpu_s": r(cpu, 1),
            "loadavg_1m": os.getloadavg()[0]}


def run(quick: bool = False, sizes: list[int] | None = None) -> dict[str, Any]:
    from engines.vllm.model import ensure_tiny_model

    sizes = sizes or [1, 2, 3]
    order = sizes if quick else sizes + sizes[:1]  # N=1 again at the end: the drift
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-bringup-"))
    os.environ.setdefault("ORDEAL_STATE_DIR", str(tmp / "state"))
    ensure_tiny_model(0)
    runs = []
    for n in order:
        progress(f"bring-up: starting a cluster of {n} replica(s) ...")
        for attempt in (1, 2, 3):
            try:
                res = start_once(n, tmp)
                break
            except Exception as e:  # noqa: BLE001 - a port race on a shared machine
                if "Address already in use" not in str(e) and "address already in use" not in \
                        "".join(Path(p).read_text(errors="replace")[-4000:]
                                for p in tmp.rglob("replica-*.log")) or attempt == 3:
                    raise
                progress(f"bring-up N={n}: a replica's port was taken before it bound "
                         f"(shared machine); starting again ({attempt}/3)")
                for p in tmp.rglob("replica-*.log"):
                    p.rename(p.with_suffix(f".failed{attempt}"))
        runs.append(res)
        progress(f"bring-up N={n}: replicas ready in {res['replicas_ready_s']} s, cluster "
                 f"in {res['cluster_ready_s']} s (load {res['loadavg_1m']:.1f})")
    by_n = aggregate(runs, sizes)
    out = {"order": order, "by_n": by_n, "runs": runs, "goal_ratio_at_3": GOAL_RATIO_3,
           "cores": os.cpu_count()}
    write_json("bringup", out)
    return out


def aggregate(runs: list[dict[str, Any]], sizes: list[int]) -> dict[int, dict[str, Any]]:
    """Per N: the fastest start (neighbours on a shared machine only ever add
    time: seen, the same N=1 start took 89 s and 247 s with the same 28.7 CPU
    seconds), the median, and the replicas' CPU seconds (the work, which the
    neighbours do not change); each as a ratio to N=1's."""
    by_n: dict[int, dict[str, Any]] = {}
    for n in sizes:
        rs = [x for x in runs if x["n"] == n]
        by_n[n] = {"replicas_ready_s": r(min(x["replicas_ready_s"] for x in rs), 2),
                   "cluster_ready_s": r(min(x["cluster_ready_s"] for x in rs), 2),
                   "replicas_ready_median_s": r(statistics.median(x["replicas_ready_s"]
                                                                  for x in rs), 2),
                   "replicas_cpu_s": r(statistics.median(x["replicas_cpu_s"] or 0 for x in rs), 1),
                   "starts": len(rs)}
    base = by_n[sizes[0]]
    for v in by_n.values():
        v["replicas_ratio"] = r(v["replicas_ready_s"] / base["replicas_ready_s"], 2)
        v["cluster_ratio"] = r(v["cluster_ready_s"] / base["cluster_ready_s"], 2)
        v["cpu_ratio"] = (r(v["replicas_cpu_s"] / base["replicas_cpu_s"], 2)
                          if base["replicas_cpu_s"] else None)
    return by_n


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    a = ap.parse_args()
    print(json.dumps(run(a.quick, a.sizes)["by_n"], indent=2))
