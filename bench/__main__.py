"""Run the harness benchmarks and print one table (performance issue 10).

    .venv/bin/python -m bench                 # everything, full (~30 min)
    .venv/bin/python -m bench --quick         # everything, shorter (~15 min)
    .venv/bin/python -m bench --only load faults
    .venv/bin/python -m bench --skip bringup agreement
    .venv/bin/python -m bench --summary-only  # rebuild the table from bench/results/*.json

Benchmarks: load (1: load generator vs vLLM's bench client), agreement (2:
TTFT/TPOT/ITL/E2E vs ``vllm bench serve`` on a real replica), proxy (3),
faults (4: effect and recovery latency per fault kind), bringup (5: N = 1, 2,
3 replicas), checkers (6, with the endurance run's RSS figures). Each writes
bench/results/<name>.json; the table goes to stdout and to
bench/results/summary.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PY, RESULTS, ROOT, machine, progress, write_json, written

ALL = ["load", "loop", "workers", "agreement", "proxy", "faults", "bringup", "checkers", "zoo"]


def run_proxy(quick: bool) -> None:
    argv = [PY, str(ROOT / "bench" / "bench_proxy.py")]
    argv += (["--requests", "1000", "--connections", "200", "--mb", "128"] if quick
             else ["--replica"])
    progress(f"proxy: {' '.join(argv[1:])}")
    subprocess.run(argv, check=True, cwd=ROOT)


def run_checkers(quick: bool, sizes: list[int] | None) -> None:
    sizes = sizes or ([100_000] if quick else [100_000, 1_000_000])
    argv = [PY, str(ROOT / "bench" / "bench_checkers.py"), "--results", "checkers-run",
            "--sizes", *map(str, sizes)]
    progress(f"checkers: {' '.join(argv[1:])}")
    subprocess.run(argv, check=True, cwd=ROOT)


def load(name: str) -> dict[str, Any] | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def yes(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def rows() -> list[dict[str, Any]]:
    """One row per figure: item, measure, ours, reference, comparison, goal, status."""
    out: list[dict[str, Any]] = []

    def add(item: str, measure: str, ours: Any, ref: Any, cmp: str, goal: str,
            ok: bool | None, by: str = "") -> None:
        out.append({"item": item, "measure": measure, "ordeal": ours, "reference": ref,
                    "comparison": cmp, "goal": goal, "status": yes(ok), "miss_by": by})

    ld = load("load")
    if ld:
        for kind, unit in (("rate", "req/s"), ("streams", "streams")):
            ms = ld[kind]["max_sustained"]
            o, v = ms.get("ordeal"), ms.get("vllm")
            ok = None if o is None or v is None else o >= v
            phases = (", the server's random phases" if ld[kind].get("phases") == "random"
                      else "")
            add("1 load", f"max sustained {unit} on one core ({ld[kind]['tokens']} tok, "
                f"{ld[kind]['itl_ms']:g} ms ITL{phases})", o, f"{v} (vllm bench)",
                f"x{o / v:.2f}" if o and v else "", ">= vLLM's client", ok,
                "" if ok in (None, True) else f"{o} vs {v} ({(o - v) / v * 100:+.0f}%)")
        held = {c: {x["step"]: x.get("held_streams") for x in ld["streams"]["runs"][c]
                    if "error" not in x} for c in ("ordeal", "vllm")}
        steps = sorted(set(held["ordeal"]) & set(held["vllm"]))
        if steps and all(held[c][st] is not None for c in held for st in steps):
            add("1 load", "streams held on average (stream-seconds / wall) at each streams "
                "step, Ordeal / vLLM's client",
                " ".join(f"{st}: {held['ordeal'][st]:g}" for st in steps),
                " ".join(f"{st}: {held['vllm'][st]:g}" for st in steps), "", "stated", None)
        arr = ld.get("streams_arrival")
        if arr:  # the closed loop as each client's first wave spreads it: stated
            lag = {c: " ".join(f"{x['step']}: {x['chunk_lag_ms']['p50']}"
                               for x in arr["runs"][c] if "error" not in x)
                   for c in ("ordeal", "vllm")}
            add("1 load", "streams with arrival phases (each stream's tokens every "
                f"{arr['itl_ms']:g} ms from its arrival): chunk lag p50 (ms) at each step",
                lag["ordeal"], lag["vllm"], "", "stated", None)
        pc = ld.get("per_chunk_at_lowest_rate", {})
        o, v = pc.get("ordeal", {}), pc.get("vllm", {})
        add("1 load", "client CPU per chunk (µs), lowest rate", o.get("cpu_us_per_chunk"),
            v.get("cpu_us_per_chunk"), ratio(o.get("cpu_us_per_chunk"), v.get("cpu_us_per_chunk")),
            "stated", None)
        add("1 load", "timing overhead per chunk p50 / p99 (ms), lowest rate",
            f"{o.get('chunk_lag_p50_ms')} / {o.get('chunk_lag_p99_ms')}",
            f"{v.get('chunk_lag_p50_ms')} / {v.get('chunk_lag_p99_ms')}", "", "stated", None)
        add("1 load", "CPU-bound ceiling, req/s of 16 tokens (1 / CPU s per request), "
            "lowest rate", o.get("cpu_ceiling_rps"), v.get("cpu_ceiling_rps"),
            ratio(o.get("cpu_ceiling_rps"), v.get("cpu_ceiling_rps")), "stated", None)
        # CPU per request at every step both ran: contention on a shared core
        # moves lags by 100x between runs, CPU spent per request much less.
        for kind, unit in (("rate", "req/s"), ("streams", "streams")):
            ratios = []
            by = {c: {x["step"]: x for x in ld[kind]["runs"][c] if "error" not in x}
                  for c in ("ordeal", "vllm")}
            for step in sorted(set(by["ordeal"]) & set(by["vllm"])):
                a, b = by["ordeal"][step], by["vllm"][step]
                if a.get("cpu_ceiling_rps") and b.get("cpu_ceiling_rps"):
                    ratios.append(a["cpu_ceiling_rps"] / b["cpu_ceiling_rps"])
            if ratios:
                med = sorted(ratios)[len(ratios) // 2]
                add("1 load", f"{kind} ladder: Ordeal / vLLM requests per CPU second, median "
                    f"over {len(ratios)} steps", f"x{med:.2f}", "x1.00",
                    " ".join(f"{x:.2f}" for x in ratios), ">= x1.00 (same capacity)",
                    med >= 0.95, "" if med >= 0.95 else f"{(1 - med) * 100:.0f}% less")
    lp = load("loop")
    if lp:
        for step, v in lp["steps"].items():
            x = v["uvloop_over_asyncio"]["cpu_us_per_chunk"]
            med = x["median"]
            ok = None if med is None else med < 0.95
            add("1 load", f"Ordeal's client on uvloop / on asyncio, CPU per chunk, {step} "
                f"({v['tokens']} tok at {v['itl_ms']:g} ms ITL; {lp['pinned']})",
                f"x{med}", "x1.00 (asyncio)", " ".join(str(p) for p in x["per_pair"]),
                "< x0.95 (measurably less)", ok, "" if ok in (None, True) else "no gain")
    wk = load("workers")
    if wk:
        ms = wk["max_sustained"]
        one, two = ms.get("1 worker"), ms.get("2 workers")
        ok = None if not one or not two else two / one >= 1.8
        add("1 load", f"--load-workers 2 on 2 cores / one process on 1 core, max sustained "
            f"req/s ({wk['tokens']} tok; clients on cores {wk['client_cores']}, "
            f"{wk['servers']} servers on {wk['server_cores'] or 'the same cores'}, "
            f"{wk.get('cores_on_machine')} on the machine)", two, f"{one} (1 process)",
            f"x{two / one:.2f}" if one and two else "", ">= x1.80", ok,
            "" if ok in (None, True) else f"x{two / one:.2f}")
    ag = load("agreement")
    if ag:
        control = ag.get("concurrent_control", {}).get("pooled", {})
        for label, table_ in (("alternating runs", ag["pooled"]), ("both at once", control)):
            for m, row in table_.items():
                for q in ("p50", "p99"):
                    x = row[q]
                    d = x["diff_pct"]
                    add("2 agreement", f"{m.replace('_ms', '').upper()} {q} (ms), {label}",
                        x["ordeal"], f"{x['vllm']} (vllm bench)",
                        f"{d:+.1f}%" if d is not None else "", f"within ±{ag['goal_pct']:g}%",
                        x["within_goal"], "" if x["within_goal"] in (None, True)
                        else f"{abs(d) - ag['goal_pct']:.1f} points over")
    px = load("proxy")
    if px:
        k = px["rows"]["keepalive_small_ms"]
        for q in ("p50", "p99"):
            added = k["proxy"][q] - k["direct"][q]
            ok = added < 0.3 if q == "p99" else None
            add("3 proxy", f"added latency, keep-alive small request {q} (ms)", k["proxy"][q],
                f"{k['direct'][q]} (direct)", f"+{added:.3f} ms",
                "p99 added < 0.3 ms (issue 26)" if q == "p99" else "stated", ok,
                "" if ok in (None, True) else f"+{added - 0.3:.2f} ms over")
        d = px["rows"]["download_MBps"]
        ratio_ = d["proxy"]["median"] / d["direct"]["median"]
        add("3 proxy", "long download throughput (MB/s)", d["proxy"]["median"],
            f"{d['direct']['median']} (direct)", f"x{ratio_:.2f}", ">= x0.90", ratio_ >= 0.9,
            "" if ratio_ >= 0.9 else f"{(0.9 - ratio_) * 100:.0f} points under")
    fl = load("faults")
    if fl:
        goal = fl["goal_p99_ms"]
        for kind, s in fl["kinds"].items():
            e, rc = s["effect_ms"]["p99"], s["recovery_ms"]["p99"]
            ok_e = e is not None and e < goal and not s["not_seen"]
            ok_r = rc is not None and rc < goal and not s["not_recovered"]
            def why(v: float | None, missing: int, word: str) -> str:
                parts = [f"{v - goal:.0f} ms over"] if v is not None and v >= goal else []
                if missing:
                    parts.append(f"{word} in {missing} of {s.get('judged', '?')}")
                return ", ".join(parts)

            add("4 faults", f"{kind}: inject() returned -> effect seen, p99 (ms)", e,
                f"inject() took {s['inject_ms']['p50']} ms (p50)",
                f"p50 {s['effect_ms']['p50']}, n={s['effect_ms']['n']}", f"p99 < {goal:g} ms",
                ok_e, "" if ok_e else why(e, s["not_seen"], "not seen"))
            add("4 faults", f"{kind}: heal() returned -> recovery seen, p99 (ms)", rc,
                f"heal() took {s['heal_ms']['p50']} ms (p50)",
                f"p50 {s['recovery_ms']['p50']}, n={s['recovery_ms']['n']}", f"p99 < {goal:g} ms",
                ok_r, "" if ok_r else why(rc, s["not_recovered"], "not recovered"))
    bu = load("bringup")
    if bu:
        for n, v in sorted(bu["by_n"].items(), key=lambda kv: int(kv[0])):
            ok = None if int(n) != 3 else v["replicas_ratio"] <= bu["goal_ratio_at_3"]
            add("5 bring-up", f"N={n}: replicas ready / cluster ready (s); replicas' CPU s",
                f"{v['replicas_ready_s']} / {v['cluster_ready_s']}; {v.get('replicas_cpu_s')}",
                "N=1", f"x{v['replicas_ratio']} / x{v['cluster_ratio']}; CPU "
                f"x{v.get('cpu_ratio')}",
                f"N=3 <= x{bu['goal_ratio_at_3']:g} of N=1" if int(n) == 3 else "", ok,
                "" if ok in (None, True) else
                f"x{v['replicas_ratio']} vs x{bu['goal_ratio_at_3']:g}")
    for name, label in (("checkers-run", "this run"), ("checkers", "committed")):
        ck = load(name)
        if ck:
            for row in ck["rows"]:
                add("6 checkers", f"{row['ops']:,} ops ({label}, {ck.get('when', '')[:10]}): "
                    "ops/s, peak RSS MB", f"{row['ops_per_s']:,} ops/s, {row['peak_rss_mb']} MB",
                    "smallest size", f"x{row['throughput_vs_smallest']} ops/s, "
                    f"x{row['rss_vs_smallest']} RSS", "flat", None)
    zoo = load("zoo")
    if zoo:
        add("7 zoo", "failure shapes planted in a real cluster: caught by the default verdict "
            "(bench/results/zoo.md)", f"{zoo['caught']} of {zoo['shapes']}"
            + (f" ({len(zoo['pending'])} shapes not planted yet)" if zoo.get("pending") else ""),
            f"clean run: {zoo['false_positives']} false positive(s)", "",
            "every shape, 0 false positives",
            zoo["caught"] == zoo["shapes"] and zoo["false_positives"] == 0,
            "" if zoo["caught"] == zoo["shapes"] else f"{zoo['shapes'] - zoo['caught']} missed")
    en = load("endurance_rss")
    if en:
        pts = ", ".join(f"{v} MB at {k} min" for k, v in en["rss_mb"].items())
        add("6 harness RSS", "30-min endurance run (12 kinds): RSS", pts,
            f"malloc in use {en['malloc_in_use_mb']['20']} -> {en['malloc_in_use_mb']['30']} MB",
            f"x{en['rss_mb']['30'] / en['rss_mb']['2']:.2f} over the run", "live memory flat",
            en["malloc_in_use_mb"]["30"] <= en["malloc_in_use_mb"]["20"])
    return out


def ratio(a: Any, b: Any) -> str:
    try:
        return f"x{a / b:.2f}"
    except (TypeError, ZeroDivisionError):
        return ""


def table(rs: list[dict[str, Any]]) -> str:
    lines = ["| item | measure | Ordeal | reference | comparison | goal | status |",
             "|---|---|---:|---:|---:|---|---|"]
    for x in rs:
        st = x["status"] + (f" ({x['miss_by']})" if x["miss_by"] else "")
        lines.append(f"| {x['item']} | {x['measure']} | {x['ordeal']} | {x['reference']} | "
                     f"{x['comparison']} | {x['goal']} | {st} |")
    return "\n".join(lines)


def summary(args: argparse.Namespace, ran: list[str], seconds: float) -> None:
    rs = rows()
    m = machine()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_json("summary", {"when": when, "machine": m, "mode": "quick" if args.quick else "full",
                           "ran": ran, "seconds": round(seconds), "rows": rs})
    missed = [x for x in rs if x["status"] == "MISSED"]
    md = [f"# Harness benchmarks ({when})", "",
          f"Machine: {m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, {m['os']}, "
          f"kernel {m['kernel']}, Python {m['python']}, no GPU. **Shared**: {m['shared']}. "
          f"Load average at the start: {', '.join(f'{x:.1f}' for x in m['loadavg_at_start'])}.",
          "",
          f"Command: `.venv/bin/python -m bench{' --quick' if args.quick else ''}` "
          f"({'quick' if args.quick else 'full'}; this call ran {', '.join(ran) or 'nothing'}"
          f" in {seconds / 60:.0f} min). The rows come from these files, each written by "
          "the run that made it: " + ", ".join(
              f"{p.name} ({written(p)})"
              for p in sorted(RESULTS.glob("*.json")) if p.name != "summary.json")
          + ". Method: bench/README.md.", "",
          table(rs), "",
          f"Goals missed: {len(missed)} of {sum(1 for x in rs if x['status'] != 'n/a')} judged."]
    notes = RESULTS / "notes.md"
    if notes.exists():
        md += ["", notes.read_text().strip()]
    (RESULTS / "summary.md").write_text("\n".join(md) + "\n")
    print("\n" + table(rs) + "\n")
    print(f"written: {RESULTS / 'summary.md'}, {RESULTS / 'summary.json'}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter steps and fewer repeats")
    ap.add_argument("--only", nargs="+", choices=ALL, default=None)
    ap.add_argument("--skip", nargs="+", choices=ALL, default=[])
    ap.add_argument("--checkers-sizes", type=int, nargs="+", default=None)
    ap.add_argument("--load-pin", action="store_true",
                    help="load bench: client on core 0, server on core 1 (default: unpinned)")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args()
    todo = [] if args.summary_only else [b for b in (args.only or ALL) if b not in args.skip]
    t0 = time.monotonic()
    ran = []
    failed = []
    for name in todo:
        progress(f"=== {name} ===")
        try:
            if name == "load":
                from bench import bench_load
                bench_load.run(args.quick, args.load_pin)
            elif name == "loop":
                from bench import bench_loop
                bench_loop.run(2 if args.quick else 3, 5.0 if args.quick else 8.0)
            elif name == "workers":
                from bench import bench_workers
                bench_workers.run(args.quick)
            elif name == "agreement":
                from bench import bench_agreement
                bench_agreement.run(args.quick)
            elif name == "proxy":
                run_proxy(args.quick)
            elif name == "faults":
                from bench import bench_faults
                bench_faults.run(args.quick)
            elif name == "bringup":
                from bench import bench_bringup
                bench_bringup.run(args.quick)
            elif name == "checkers":
                run_checkers(args.quick, args.checkers_sizes)
            elif name == "zoo":
                from bench import bench_zoo
                bench_zoo.run(args.quick)
            ran.append(name)
        except Exception as e:  # noqa: BLE001 - one failing bench must not hide the others
            progress(f"{name} FAILED: {type(e).__name__}: {e}")
            failed.append(name)
    summary(args, ran, time.monotonic() - t0)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
