"""Item 2 of the performance issue: does the suite measure what vLLM measures?

One real local vLLM replica (the tiny model, engines/vllm/nodes.py). The
same prompts (load.plan.plan_requests: streamed completions, greedy,
8-32 words, 16-48 tokens) at the same rate with steady arrivals, sent in
alternating runs by Ordeal's workload client (WorkloadRunner + History, the
suite's path) and by vLLM's own benchmark client (bench/vllm_client.py, the
module of ``vllm bench serve``). Ordeal's figures are what its slo_latency
checker reports over the history (log-bucket sketch, 1% relative error) and,
beside them, exact percentiles of the same samples; vLLM's are those it
reports itself. Runs of each client are pooled; each pair is also kept.

Each client runs in a process of its own, on its own default event loop:
vLLM's in bench/vllm_client.py (asyncio), Ordeal's in a spawned process
(``ordeal_run`` through ``OrdealWorker``) with the suite's ``--load-loop
auto`` (uvloop where vLLM is installed). Until 2026-12-05 Ordeal's ran
inside this orchestrator, on asyncio, beside the threads and children it
watches.

The replica runs without prefix caching (each prompt goes out once per
client). Runs alternate (the brief's method); then a control run sends both
clients' requests at the same time at half the rate each, so both see the
same server and the same neighbours at every moment (on a shared machine
the alternating runs also measure how the neighbours' load moved).

Known differences in what is sent: Ordeal asks for ``return_token_ids`` and
continuous usage stats (its stream checks need them); vLLM's client sends
``repetition_penalty: 1.0``. E2E: vLLM ends a request at its last token
chunk, Ordeal at the end of the stream ([DONE]); TPOT follows from E2E in both.

    python -m bench.bench_agreement [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import PY, Child, diff_pct, pct, progress, r, write_json

GOAL_PCT = 5.0
UNIFORM = 1e6
METRICS = (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2el"))


def spec_for(rate: float, duration: float, seed: int) -> Any:
    from load.spec import WorkloadSpec
    return WorkloadSpec(duration_s=duration, mode="open", rate=rate, burstiness=UNIFORM,
                        seed=seed, prompt_words=(8, 32), max_tokens=(16, 48), stream_share=1.0,
                        chat_share=0.0, canary_every=0, temperature=0.0, timeout_s=60.0)


def ordeal_run(url: str, rate: float, duration: float, seed: int, tmp: Path) -> dict[str, Any]:
    from invariants.base import RunContext, check_all
    from invariants.slo import LatencySLO
    from load import event_loop
    from load.workload import WorkloadRunner
    from ordeal.history.reader import read_history
    from ordeal.history.writer import History

    path = tmp / f"history-{uuid.uuid4().hex[:6]}.jsonl"
    hist = History(path)
    event_loop.run(WorkloadRunner(spec_for(rate, duration, seed), url, hist).run(), "auto")
    hist.close()
    [res] = check_all([LatencySLO()], read_history(path), RunContext(run_id="bench"))
    steady = res.details["windows"]["steady"]
    raw: dict[str, list[float]] = {m: [] for m, _ in METRICS}
    for op in read_history(path):
        if op.type == "ok":
            for m, _ in METRICS:
                v = op.value.get(m)
                if isinstance(v, list):
                    raw[m].extend(v)
                elif isinstance(v, (int, float)):
                    raw[m].append(v)
    return {"requests": steady["requests"], "ok": steady["ok"],
            "checker": {m: {"p50": steady[m]["p50"], "p99": steady[m]["p99"]}
                        for m, _ in METRICS},
            "raw": raw}


class OrdealWorker:
    """Ordeal's client in a process of its own (spawned once), as vLLM's
    is: ``ordeal_run`` there."""

    def __init__(self) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def start(self, url: str, rate: float, duration: float, seed: int, tmp: Path) -> Any:
        return self.pool.submit(ordeal_run, url, rate, duration, seed, tmp)

    def run(self, url: str, rate: float, duration: float, seed: int,
            tmp: Path) -> dict[str, Any]:
        return self.start(url, rate, duration, seed, tmp).result()

    def stop(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class VllmWorker:
    """vLLM's bench client in one long-lived process (bench.vllm_client --serve)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.child = Child([PY, "-m", "bench.vllm_client", "--serve"], tmp / "vllm-client.log",
                           stdin_pipe=True)
        self.child.wait_line("READY", timeout=180)

    def start(self, url: str, prompts: Path, rate: float, out: Path) -> None:
        cmd = {"url": url, "prompts": str(prompts), "rate": rate, "burstiness": UNIFORM,
               "out": str(out)}
        stdin = self.child.stdin
        assert stdin is not None
        stdin.write((json.dumps(cmd) + "\n").encode())
        stdin.flush()

    def wait(self) -> None:
        line = self.child.wait_line(("DONE", "FAILED"), timeout=900)
        if not line.startswith("DONE"):
            raise RuntimeError(f"vLLM's bench client failed; see {self.tmp / 'vllm-client.log'}")

    def stop(self) -> None:
        if self.child.stdin:
            self.child.stdin.close()
        self.child.stop()


def write_prompts(rate: float, duration: float, seed: int, tmp: Path) -> Path:
    from load.plan import plan_requests

    plan = list(plan_requests(spec_for(rate, duration, seed), limit_s=duration))
    path = tmp / f"prompts-{seed}-{rate:g}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.prompt, "max_tokens": p.max_tokens}) + "\n"
                            for p in plan))
    return path


def read_vllm(out: Path, n: int) -> dict[str, Any]:
    res = json.loads(out.read_text())
    raw: dict[str, list[float]] = {m: [] for m, _ in METRICS}
    for tt, itls, lat, k, err in zip(res["ttfts"], res["itls"], res["latencies"],
                                     res["output_lens"], res["errors"]):
        if err or not tt:
            continue
        raw["ttft_ms"].append(tt * 1e3)
        raw["itl_ms"].extend(x * 1e3 for x in itls)
        raw["e2e_ms"].append(lat * 1e3)
        if k and k > 1:
            raw["tpot_ms"].append((lat - tt) / (k - 1) * 1e3)
    return {"requests": n, "ok": res["completed"],
            "reported": {m: {"p50": res.get(f"median_{v}_ms"), "p99": res.get(f"p99_{v}_ms")}
                         for m, v in METRICS},
            "raw": raw}


def vllm_run(worker: VllmWorker, url: str, rate: float, duration: float, seed: int,
             tmp: Path) -> dict[str, Any]:
    prompts = write_prompts(rate, duration, seed, tmp)
    out = tmp / f"vllm-{uuid.uuid4().hex[:6]}.json"
    worker.start(url, prompts, rate, out)
    worker.wait()
    return read_vllm(out, len(prompts.read_text().splitlines()))


def show(label: str, res: dict[str, Any]) -> None:
    raw = res["raw"]
    progress(f"agreement {label}: {res['ok']}/{res['requests']} ok, "
             + ", ".join(f"{m[:-3]} p50 {pct(raw[m], 50):.2f} p99 {pct(raw[m], 99):.2f}"
                         for m, _ in METRICS if raw[m]))


def run(quick: bool = False, pairs: int | None = None, rate: float = 4.0) -> dict[str, Any]:
    from engines.vllm.model import ensure_tiny_model
    from engines.vllm.nodes import VllmReplica
    from nodes.ports import free_ports
    from ordeal.topology import Endpoint

    pairs = pairs or (3 if quick else 10)  # 10 x ~80 requests: a p99 of ~800 samples
    duration = 15.0 if quick else 20.0
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-agree-"))
    os.environ.setdefault("ORDEAL_STATE_DIR", str(tmp / "state"))
    port = free_ports(1)[0]
    # No prefix caching: the same prompts go out once per client, and the
    # second client must not get the first one's cached prefix.
    rep = VllmReplica("bench-replica", Endpoint("127.0.0.1", port), ensure_tiny_model(0).path,
                      tmp / "replica.log", f"bench-agree-{uuid.uuid4().hex[:6]}",
                      extra_args=["--no-enable-prefix-caching"])
    progress(f"agreement: starting a real vLLM replica and vLLM's bench client "
             f"(logs in {tmp}) ...")
    t0 = time.monotonic()
    rep.start()
    worker = VllmWorker(tmp)
    ordeal = OrdealWorker()
    runs: list[dict[str, Any]] = []
    concurrent: list[dict[str, Any]] = []
    try:
        rep.wait_ready(300)
        url = rep.endpoint.url
        progress(f"agreement: replica ready in {time.monotonic() - t0:.0f}s; {pairs} pairs of "
                 f"runs, {rate:g} req/s for {duration:g}s each, alternating who goes first")
        ordeal.run(url, rate, 3.0, 999, tmp)  # warm-up: the first requests are slow
        for i in range(pairs):
            order = ["ordeal", "vllm"] if i % 2 == 0 else ["vllm", "ordeal"]
            for client in order:
                res = (ordeal.run(url, rate, duration, i, tmp) if client == "ordeal"
                       else vllm_run(worker, url, rate, duration, i, tmp))
                res.update({"client": client, "pair": i})
                runs.append(res)
                show(f"pair {i} {client:6}", res)
        # Control: both clients at the same time, half the rate each, so both
        # see the same server and the same neighbours at every moment.
        d2 = 60.0 if quick else 90.0
        prompts = write_prompts(rate / 2, d2, 100, tmp)
        out = tmp / "vllm-concurrent.json"
        progress(f"agreement: control run, both clients at once, {rate / 2:g} req/s each "
                 f"for {d2:g}s")
        worker.start(url, prompts, rate / 2, out)
        o = ordeal.run(url, rate / 2, d2, 100, tmp)
        worker.wait()
        v = read_vllm(out, len(prompts.read_text().splitlines()))
        for res, client in ((o, "ordeal"), (v, "vllm")):
            res.update({"client": client, "pair": 0})
            concurrent.append(res)
            show(f"control {client:6}", res)
    finally:
        ordeal.stop()
        worker.stop()
        rep.stop()
    out_ = {"rate": rate, "duration_s": duration, "pairs": pairs, "goal_pct": GOAL_PCT,
            "arrivals": "steady (gamma shape 1e6) for both", "prefix_caching": False,
            **compare(runs), "concurrent_control": compare(concurrent)}
    write_json("agreement", out_)
    return out_


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled raw samples per client, Ordeal's checker figures (from the
    pooled-run mean of its per-run figures is not a percentile, so the
    checker is also asked per run and shown per pair)."""
    pooled: dict[str, dict[str, list[float]]] = {"ordeal": {}, "vllm": {}}
    for x in runs:
        for m, v in x["raw"].items():
            pooled[x["client"]].setdefault(m, []).extend(v)
    table = {}
    for m, _ in METRICS:
        row = {}
        for q in (50, 99):
            o = pct(pooled["ordeal"].get(m, []), q)
            v = pct(pooled["vllm"].get(m, []), q)
            row[f"p{q}"] = {"ordeal": r(o), "vllm": r(v), "diff_pct": diff_pct(o, v),
                            "within_goal": (abs(diff_pct(o, v)) <= GOAL_PCT
                                            if diff_pct(o, v) is not None else None)}
        table[m] = row
    per_pair = []
    for i in sorted({x["pair"] for x in runs}):
        o = next(x for x in runs if x["pair"] == i and x["client"] == "ordeal")
        v = next(x for x in runs if x["pair"] == i and x["client"] == "vllm")
        per_pair.append({"pair": i, **{m: {q: {"ordeal_checker": o["checker"][m][q],
                                               "vllm_reported": v["reported"][m][q],
                                               "diff_pct": diff_pct(o["checker"][m][q],
                                                                    v["reported"][m][q])}
                                           for q in ("p50", "p99")} for m, _ in METRICS}})
    return {"pooled": table, "per_pair_checker_vs_vllm": per_pair,
            "samples": {c: {m: len(v) for m, v in d.items()} for c, d in pooled.items()},
            "runs": [{k: v for k, v in x.items() if k != "raw"} for x in runs]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--rate", type=float, default=4.0)
    a = ap.parse_args()
    print(json.dumps(run(a.quick, a.pairs, a.rate)["pooled"], indent=2))
