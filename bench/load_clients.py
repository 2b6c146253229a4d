"""One load-generator run in its own process, pinned to one core, against the
bench SSE server: either Ordeal's workload client (load/workload.py with
a real History) or vLLM's own benchmark client (vllm.benchmarks.serve, the
module behind ``vllm bench serve``). Writes one JSON of figures.

    python -m bench.load_clients ordeal --url URL --rate R --duration S --tokens T --out F
    python -m bench.load_clients vllm   --url URL --rate R --duration S --tokens T --out F
    (--concurrency C for a closed loop of C streams instead of a rate)

Figures, computed the same way for both clients:
- sent/ok and the achieved request rate (ok requests / planned duration);
- dispatch lag: when a request was sent vs when its plan said (uniform arrivals);
- chunk lag: when the client recorded a chunk vs when the server wrote it (the
  server puts its CLOCK_MONOTONIC ns in each chunk's text; both clocks are
  CLOCK_MONOTONIC on this machine): transport plus the client's own delay;
- client CPU seconds per chunk while the load ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, pct, r

sys.path.insert(0, str(ROOT))

UNIFORM = 1e6  # gamma shape: arrivals at a steady pace, the same for both clients


def cpu_self() -> float:
    """This process's CPU seconds (load workers report their own)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def summarize(planned_n: int, duration: float, sent: int, ok: int, dispatch_ms: list[float],
              chunk_lag_ms: list[float], chunks: int, cpu_s: float, wall_s: float,
              ttft_ms: list[float], itl_ms: list[float],
              stream_s: float = 0.0, held_over_s: float | None = None) -> dict[str, Any]:
    """``stream_s``: the ok requests' seconds from send to the end of their
    stream, summed. Over ``wall_s`` it is how many streams the client held
    open on average (``held_streams``): a closed loop of C streams holds
    fewer than C when the client is slow to start the next one. ``held_over_s``:
    the load's own span when ``wall_s`` holds more (vLLM's client times one
    test request before its benchmark starts)."""
    return {
        "planned": planned_n, "sent": sent, "ok": ok,
        "achieved_rps": r(ok / duration, 2), "chunks": chunks,
        "dispatch_lag_ms": {"p50": r(pct(dispatch_ms, 50)), "p99": r(pct(dispatch_ms, 99)),
                            "max": r(max(dispatch_ms) if dispatch_ms else None)},
        "chunk_lag_ms": {"p50": r(pct(chunk_lag_ms, 50)), "p99": r(pct(chunk_lag_ms, 99)),
                         "max": r(max(chunk_lag_ms) if chunk_lag_ms else None)},
        "ttft_ms": {"p50": r(pct(ttft_ms, 50)), "p99": r(pct(ttft_ms, 99))},
        "itl_ms": {"p50": r(pct(itl_ms, 50)), "p99": r(pct(itl_ms, 99))},
        "cpu_s": r(cpu_s), "wall_s": r(wall_s), "cpu_share": r(cpu_s / wall_s if wall_s else 0),
        "cpu_us_per_chunk": r(cpu_s / chunks * 1e6, 2) if chunks else None,
        "held_streams": r(stream_s / (held_over_s or wall_s), 1) if wall_s else None,
    }


def stamps(text: str) -> list[int]:
    out = []
    for w in text.split():
        try:
            out.append(int(w))
        except ValueError:
            pass
    return out


# -- Ordeal's client ---------------------------------------------------------

def run_ordeal(args: argparse.Namespace) -> dict[str, Any]:
    from load import event_loop
    from load.plan import plan_requests
    from load.spec import WorkloadSpec
    from load.workers import run_in_workers
    from load.workload import WorkloadRunner
    from ordeal.history.ops import stream_texts
    from ordeal.history.reader import read_history
    from ordeal.history.writer import History

    closed = args.concurrency is not None
    spec = WorkloadSpec(
        duration_s=args.duration, mode="closed" if closed else "open",
        rate=args.rate or 1.0, burstiness=UNIFORM, concurrency=args.concurrency or 1,
        prompt_words=(8, 8), max_tokens=(args.tokens, args.tokens), stream_share=1.0,
        chat_share=0.0, canary_every=0, temperature=0.0, timeout_s=60.0,
        max_in_flight=max(4096, (args.concurrency or 0) + 16))
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-load-"))
    hist = History(tmp / "history.jsonl")
    runner = WorkloadRunner(spec, args.url, hist, progress=None)
    c0, w0 = cpu_self(), time.monotonic()
    event_loop.run(runner.run() if args.workers == 1
                   else run_in_workers(runner, args.workers, loop=args.loop), args.loop)
    # From the load's start: with load workers, their start-up (spawn,
    # imports: ~1 s of CPU each, once a run) is left out, on both counts.
    wall_s = time.monotonic() - runner.t0
    args.workers_cpu_s = getattr(runner, "worker_cpu_s", 0.0)
    cpu_s = cpu_self() - c0 + args.workers_cpu_s
    w0 = runner.t0
    args.window = (w0, w0 + wall_s)
    hist.close()
    plan = [] if closed else [p.at_s for p in plan_requests(spec, limit_s=args.duration)]
    invokes: dict[Any, int] = {}
    inv_seq: dict[Any, int] = {}
    dispatch, lag, ttft, itl = [], [], [], []
    sent = ok = chunks = 0
    stream_s = 0.0
    t_first = None
    for op in read_history(tmp / "history.jsonl"):
        if op.type == "invoke":
            sent += 1
            key = (op.process, op.value["seq"])
            invokes[key] = op.time_ns
            if not closed:
                if t_first is None:
                    t_first = op.time_ns - plan[0] * 1e9
                dispatch.append((op.time_ns - t_first - plan[op.value["seq"]] * 1e9) / 1e6)
            continue
        if op.type != "ok":
            continue
        ok += 1
        v = op.value
        start = invokes.get((op.process, v.get("seq")))
        ttft.append(v["ttft_ms"])
        stream_s += v["e2e_ms"] / 1e3
        itl.extend(v.get("itl_ms") or [])
        # Each token event's arrival from the send: TTFT, then the ITLs
        # (the history keeps times as these columns, not per event).
        t_ms = v["ttft_ms"]
        times = [t_ms]
        for gap in v.get("itl_ms") or []:
            t_ms += gap
            times.append(t_ms)
        for t, text in zip(times, stream_texts(v.get("stream"))):
            chunks += 1
            st = stamps(text)
            if st and start is not None:
                # start_ns is taken right after the invoke op's time (tens of µs later),
                # so this understates the lag by that much at most.
                lag.append((start + t * 1e6 - st[0]) / 1e6)
    return summarize(len(plan) if plan else sent, args.duration, sent, ok, dispatch, lag, chunks,
                     cpu_s, wall_s, ttft, itl, stream_s)


# -- vLLM's client -------------------------------------------------------------

def vllm_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same prompts Ordeal's client sends (its plan, 8 words, fixed
    tokens); a closed loop gets enough for ``duration`` at full speed."""
    from load.plan import plan_requests
    from load.spec import WorkloadSpec

    closed = args.concurrency is not None
    n = (args.concurrency * max(1, round(args.duration * 1000 / (args.tokens * args.itl_ms)))
         if closed else max(1, int(args.rate * args.duration)))
    spec = WorkloadSpec(prompt_words=(8, 8), max_tokens=(args.tokens, args.tokens),
                        canary_every=0, stream_share=1.0, chat_share=0.0, mode="closed")
    return [{"prompt": p.prompt, "max_tokens": args.tokens}
            for p, _ in zip(plan_requests(spec), range(n))]


def vllm_figures(res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's detailed result -> the same figures as Ordeal's."""
    closed = args.concurrency is not None
    starts = res["start_times"]
    dispatch, lag, ttft, itl = [], [], [], []
    chunks = ok = 0
    stream_s = 0.0
    for i, (st, tt, itls, text, err) in enumerate(zip(starts, res["ttfts"], res["itls"],
                                                     res["generated_texts"], res["errors"])):
        if not closed:
            dispatch.append((st - starts[0] - i / args.rate) * 1e3)
        if err or not tt:
            continue
        ok += 1
        ttft.append(tt * 1e3)
        itl.extend(x * 1e3 for x in itls)
        stream_s += tt + sum(itls)
        t = st + tt
        recv = [t]
        for x in itls:
            t += x
            recv.append(t)
        server = stamps(text)
        chunks += len(recv)
        for a, b in zip(recv, server):
            lag.append((a * 1e9 - b) / 1e6)
    out = summarize(len(starts), args.duration if not closed else res["wall_s"],
                    len(starts), ok, dispatch, lag, chunks, res["cpu_s"], res["wall_s"],
                    ttft, itl, stream_s, held_over_s=res.get("duration"))
    out["vllm_reported"] = {k: res.get(k) for k in ("request_throughput", "completed", "failed",
                                                     "duration", "median_ttft_ms", "p99_ttft_ms",
                                                     "median_itl_ms", "p99_itl_ms")}
    out["t_start"], out["t_end"] = res["t_start"], res["t_start"] + res["wall_s"]
    # The load itself (time.perf_counter() is CLOCK_MONOTONIC here, as
    # time.monotonic()): first send to the last token of the last request.
    ends = [st + (tt or 0.0) + sum(itls) for st, tt, itls in
            zip(starts, res["ttfts"], res["itls"])]
    if starts:
        out["load_start"], out["load_end"] = min(starts), max(ends)
    return out


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    from bench.vllm_client import run

    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-vllm-"))
    res = run(args.url, vllm_prompts(args), tmp / "out.json", rate=args.rate,
              concurrency=args.concurrency, burstiness=UNIFORM)
    out = vllm_figures(res, args)
    args.window = (out["t_start"], out["t_end"])
    return out


def main() -> None:
    from load.event_loop import LOOPS, describe

    ap = argparse.ArgumentParser()
    ap.add_argument("client", choices=["ordeal", "vllm"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--itl-ms", type=float, default=10.0, help="the server's, for sizing")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--cpus", default=None, help="pin to these cores (e.g. 0,1), workers too")
    ap.add_argument("--workers", type=int, default=1, help="ordeal: load worker processes")
    ap.add_argument("--loop", choices=LOOPS, default="auto",
                    help="ordeal: the client's event loop, as --load-loop (default auto: "
                         "what the product runs; bench/bench_loop.py compares them)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import logging
    logging.disable(logging.WARNING)
    out = run_ordeal(args) if args.client == "ordeal" else run_vllm(args)
    out.update({"t_start": args.window[0], "t_end": args.window[1], "client": args.client, "rate": args.rate, "concurrency": args.concurrency,
                "duration_s": args.duration, "tokens": args.tokens,
                "workers": args.workers, "loop": describe(args.loop) if args.client == "ordeal" else "asyncio", "workers_cpu_s": r(getattr(args, "workers_cpu_s", 0.0))})
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
