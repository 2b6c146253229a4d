"""Checker throughput and memory on long histories.

    .venv/bin/python bench/bench_checkers.py            # 1e5, 1e6, 1e7 ops
    .venv/bin/python bench/bench_checkers.py --sizes 100000 1000000

For each size: write a synthetic history (steady load, a fault window every
10^5 ops, streams with token ids but without per-chunk records, as a long
run would keep them), then run every default checker over it in one pass
in a fresh process, measuring ops/s and peak RSS. Each figure is read side
by side with the smallest size's in the same run: memory should stay flat as
the history grows 100-fold, and throughput should not fall.
Writes bench/results/checkers.json and checkers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_history(path: Path, n_ops: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    t = 0
    idx = 0
    proc = 0
    with path.open("w") as f:
        def put(type_, process, fn, value, error=None):
            nonlocal idx
            f.write(json.dumps({"index": idx, "time_ns": t, "wall": "2026-01-01T00:00:00.000Z",
                                "type": type_, "process": process, "f": fn, "value": value,
                                "error": error}, separators=(",", ":")) + "\n")
            idx += 1
        while idx < n_ops:
            if idx % 100_000 == 50_000:
                v = {"kind": "process_kill", "target": "replica-1"}
                put("info", "nemesis", "inject", {**v, "phase": "begin"})
                put("info", "nemesis", "inject", {**v, "phase": "end"})
                put("info", "nemesis", "heal", {**v, "phase": "begin"})
                put("info", "nemesis", "heal", {**v, "phase": "end", "restarted": True,
                                                "ready_after_s": 30.0})
            proc += 1
            mt = rng.randint(8, 32)
            canary = proc % 10 == 0
            put("invoke", proc, "completions", {"max_tokens": mt, "canary": canary,
                                               "prompt": "canary" if canary else "p"})
            t += rng.randint(50_000_000, 150_000_000)
            ttft = rng.uniform(20, 400)
            itl = [round(rng.uniform(2, 10), 3) for _ in range(mt - 1)]
            value = {"node": "replica-0", "ttft_ms": ttft, "itl_ms": itl, "tpot_ms": 5.0,
                     "e2e_ms": ttft + sum(itl), "output_tokens": mt, "finish_reason": "length",
                     "usage": {"completion_tokens": mt},
                     "stream": {"ids": ["c"], "finish_reasons": ["length"], "done": True,
                                "after_done": 0, "errors": [], "malformed": [],
                                "n_chunks": mt, "n_token_ids": mt}}
            if canary:
                value["text"] = "golden"
            put("ok", proc, "completions", value)


def check_file(path: str) -> None:
    """Runs in a fresh process so peak RSS is this size's alone."""
    import faults.catalogue  # noqa: F401 - the fault kinds the window checkers ask about
    from invariants import DEFAULT_CHECKERS, RunContext
    from invariants.base import check_all
    from ordeal.history.reader import read_history

    t0 = time.perf_counter()
    n = 0

    def counted():
        nonlocal n
        for op in read_history(path):
            n += 1
            yield op

    results = check_all([c() for c in DEFAULT_CHECKERS], counted(), RunContext())
    dt = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ops": n, "seconds": round(dt, 2), "ops_per_s": round(n / dt),
                      "peak_rss_mb": round(rss_mb, 1),
                      "valid": {r.name: r.valid for r in results}}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--workdir", default="/tmp/ordeal-bench")
    ap.add_argument("--results", default="checkers",
                    help="name of the result files in bench/results (NAME.json, NAME.md)")
    ap.add_argument("--check-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.check_file:
        check_file(args.check_file)
        return 0
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        path = work / f"history-{size}.jsonl"
        t0 = time.perf_counter()
        write_history(path, size)
        gen_s = time.perf_counter() - t0
        print(f"[bench] {size:>10,} ops written in {gen_s:.0f}s ({path.stat().st_size >> 20} MiB);"
              " checking ...", flush=True)
        out = subprocess.run([sys.executable, __file__, "--check-file", str(path)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["file_mib"] = path.stat().st_size >> 20
        rows.append(row)
        print(f"[bench] {row['ops']:>10,} ops: {row['seconds']}s, {row['ops_per_s']:,} ops/s, "
              f"peak RSS {row['peak_rss_mb']} MB", flush=True)
        path.unlink()
    base = rows[0]
    for r in rows:
        r["rss_vs_smallest"] = round(r["peak_rss_mb"] / base["peak_rss_mb"], 2)
        r["throughput_vs_smallest"] = round(r["ops_per_s"] / base["ops_per_s"], 2)
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    (res / f"{args.results}.json").write_text(json.dumps(
        {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
         "checkers": "every default checker, one pass", "rows": rows}, indent=2) + "\n")
    lines = ["| ops | seconds | ops/s | peak RSS MB | RSS vs smallest | ops/s vs smallest | file MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ops']:,} | {r['seconds']} | {r['ops_per_s']:,} | {r['peak_rss_mb']} "
                     f"| {r['rss_vs_smallest']} | {r['throughput_vs_smallest']} | {r['file_mib']} |")
    (res / f"{args.results}.md").write_text("# Checker throughput and memory\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
