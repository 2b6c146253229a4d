"""Item 4 of the performance issue: fault effect latency.

The real fault classes of faults/ act on real processes: the bench SSE
server run as a labelled node (nodes.process.ManagedProcess behind a
engines.vllm.nodes.LocalNode, as a replica would be) and Ordeal's fault
proxy in front of it (faults.proxy, one link). A prober thread opens a new
connection and sends ``GET /health`` every 1 ms (5 ms through the proxy, a
Python process that 1000 new connections a second overload), never waiting
for the previous probe, and records when each was sent and what it saw.

For each injection: *effect latency* = from ``inject()`` returning to the send
time of the first probe that saw the fault; *recovery latency* = from
``heal()`` returning to the first probe that saw a normal answer (200 in under
50 ms). ``*_steady`` is the share of later probes that agreed (the effect
held, the recovery lasted). 0 means the first
probe after the return already saw it (resolution: the probe interval). Also
recorded: how long ``inject()`` and ``heal()`` themselves took (a kill waits
for the whole process group; its heal restarts the node and waits until it
serves), and ``detect`` = when that first probe *knew* (a dropped packet is
only known at the probe's timeout, a 100 ms latency after 100 ms).

What a probe counts as the effect, per kind:
  network_partition reject  connection refused or reset
  network_partition drop    no answer within the probe timeout
  process_kill              connection refused
  process_pause             no answer within the probe timeout (or 90 ms late)
  network_latency 100 ms    an answer, but 90 ms or later
  connection_reset          connection reset / closed without an answer
  http_fault abort          HTTP 503 from the proxy

    python -m bench.bench_faults [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.common import PY, ROOT, pct, progress, r, write_json

PROBE_EVERY_S = {"node": 0.001, "link": 0.005}  # the proxy is Python: 200 new conns/s
PROBE_TIMEOUT_S = 0.3
GOAL_P99_MS = 50.0
HOLD_S = 0.7


@dataclass
class Probe:
    sent: float
    done: float = 0.0
    status: int | None = None
    error: str | None = None  # refused, reset, closed, timeout

    @property
    def rtt_ms(self) -> float:
        return (self.done - self.sent) * 1e3


class Prober:
    """A new connection and ``GET /health`` every interval, in a thread."""

    def __init__(self, host: str, port: int, every_s: float):
        self.host, self.port, self.every_s = host, port, every_s
        self.probes: list[Probe] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="bench-prober", daemon=True)

    def start(self) -> "Prober":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._loop())

    async def _one(self, p: Probe) -> None:
        writer = None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(b"GET /health HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
                line = await reader.readline()
                if not line:
                    p.error = "closed"
                else:
                    p.status = int(line.split()[1])
        except TimeoutError:
            p.error = "timeout"
        except ConnectionRefusedError:
            p.error = "refused"
        except (ConnectionResetError, BrokenPipeError):
            p.error = "reset"
        except (OSError, ValueError, IndexError) as e:
            p.error = type(e).__name__
        finally:
            p.done = time.monotonic()
            if writer is not None:
                writer.close()

    async def _loop(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        nxt = time.monotonic()
        while not self._stop.is_set():
            p = Probe(time.monotonic())
            self.probes.append(p)
            t = asyncio.create_task(self._one(p))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            nxt += self.every_s
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        await asyncio.gather(*tasks, return_exceptions=True)

    def window(self, t0: float, t1: float) -> list[Probe]:
        return [p for p in self.probes if t0 <= p.sent < t1 and p.done]


def first_seen(probes: list[Probe], pred: Callable[[Probe], bool], t_ret: float
               ) -> tuple[float | None, float | None, float | None]:
    """For the first probe that satisfies ``pred``: its send time and its
    done time after ``t_ret`` in ms, and the share of the probes from it on
    that satisfy ``pred`` too (how steady the effect was); Nones if none."""
    for i, p in enumerate(probes):
        if pred(p):
            rest = probes[i:]
            agree = sum(1 for x in rest if pred(x)) / len(rest)
            return (max(0.0, (p.sent - t_ret) * 1e3), (p.done - t_ret) * 1e3, agree)
    return None, None, None


def healthy(p: Probe) -> bool:
    return p.status == 200 and p.rtt_ms < 50


KINDS: dict[str, dict[str, Any]] = {
    "network_partition_reject": {"effect": lambda p: p.error in ("refused", "reset")},
    "network_partition_drop": {"effect": lambda p: p.error == "timeout"},
    "process_kill": {"effect": lambda p: p.error == "refused"},
    "process_pause": {"effect": lambda p: p.error == "timeout" or p.rtt_ms >= 90},
    "network_latency_100ms": {"effect": lambda p: p.status == 200 and p.rtt_ms >= 90},
    "connection_reset": {"effect": lambda p: p.error in ("reset", "closed")},
    "http_fault_abort": {"effect": lambda p: p.status == 503},
}


def run(quick: bool = False, reps: int | None = None, kinds: list[str] | None = None
        ) -> dict[str, Any]:
    from faults.connection_reset import ConnectionReset
    from faults.http_fault import HttpFault
    from faults.ledger import Ledger
    from faults.network_latency import NetworkLatency
    from faults.network_partition import NetworkPartition
    from faults.process_kill import ProcessKill
    from faults.process_pause import ProcessPause
    from faults.proxy.launch import ProxyProcess
    from nodes.local import LocalNode
    from nodes.ports import free_ports
    from nodes.process import ManagedProcess
    from ordeal.topology import Endpoint, Link

    reps = reps or (8 if quick else 20)
    tmp = Path(tempfile.mkdtemp(prefix="ordeal-bench-faults-"))
    os.environ["ORDEAL_STATE_DIR"] = str(tmp / "state")
    run_id = f"bench-faults-{uuid.uuid4().hex[:6]}"
    ledger = Ledger(tmp / "ledger")
    port = free_ports(1)[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = ManagedProcess("sse-node", [PY, str(ROOT / "bench" / "sse_server.py"), "--port",
                                       str(port)], env, tmp / "sse-node.log", run_id)
    node = LocalNode("sse-node", "replica", Endpoint("127.0.0.1", port), proc,
                     "see the bench SSE server's log")
    node.start()
    node.wait_ready(30)
    proxy = ProxyProcess([f"bench=0:127.0.0.1:{port}"], stderr_path=tmp / "proxy.log").start()
    assert proxy.control is not None
    link = Link("bench", "client", "sse-node", proxy.listens["bench"], node.endpoint,
                proxy.control)

    def make(kind: str) -> tuple[Any, tuple[str, int]]:
        direct = ("127.0.0.1", port)
        via = (link.listen.host, link.listen.port)
        if kind == "network_partition_reject":
            return NetworkPartition(node, run_id, ledger, mode="reject"), direct
        if kind == "network_partition_drop":
            return NetworkPartition(node, run_id, ledger, mode="drop"), direct
        if kind == "process_kill":
            return ProcessKill(node, run_id, ledger, restart=True, ready_timeout_s=30), direct
        if kind == "process_pause":
            return ProcessPause(node, run_id, ledger), direct
        if kind == "network_latency_100ms":
            return NetworkLatency(link, run_id, ledger, latency_ms=100.0), via
        if kind == "connection_reset":
            return ConnectionReset(link, run_id, ledger, timeout_ms=0), via
        if kind == "http_fault_abort":
            return HttpFault(link, run_id, ledger, mode="abort"), via
        raise ValueError(kind)

    out: dict[str, Any] = {"reps": reps,
                           "probe_every_ms": {k: v * 1e3 for k, v in PROBE_EVERY_S.items()},
                           "probe_timeout_ms": PROBE_TIMEOUT_S * 1e3, "hold_s": HOLD_S,
                           "goal_p99_ms": GOAL_P99_MS, "kinds": {}}
    try:
        for kind in kinds or list(KINDS):
            pred = KINDS[kind]["effect"]
            rows: list[dict[str, Any]] = []
            for i in range(reps):
                fault, (host, p) = make(kind)
                every = PROBE_EVERY_S["link" if p != port else "node"]
                prober = Prober(host, p, every).start()
                time.sleep(0.15)  # a healthy baseline
                t_a = time.monotonic()
                fault.inject()
                t_i = time.monotonic()
                time.sleep(HOLD_S)
                t_b = time.monotonic()
                fault.heal()
                t_h = time.monotonic()
                time.sleep(HOLD_S)
                prober.stop()
                base = prober.window(t_a - 0.1, t_a)
                eff = first_seen(prober.window(t_i, t_b - PROBE_TIMEOUT_S), pred, t_i)
                rec = first_seen(prober.window(t_h, t_h + HOLD_S - PROBE_TIMEOUT_S), healthy, t_h)
                rows.append({"inject_ms": r((t_i - t_a) * 1e3), "heal_ms": r((t_h - t_b) * 1e3),
                             "effect_ms": r(eff[0]), "effect_detect_ms": r(eff[1]),
                             "effect_steady": r(eff[2], 3),
                             "recovery_ms": r(rec[0]), "recovery_detect_ms": r(rec[1]),
                             "recovery_steady": r(rec[2], 3),
                             "baseline_healthy": r(sum(map(healthy, base)) / max(1, len(base)), 3),
                             "probes": len(prober.window(t_a - 0.15, t_h + HOLD_S))})
            out["kinds"][kind] = summarize(rows)
            s = out["kinds"][kind]
            progress(f"faults {kind:26} ({s['judged']} of {reps} judged) effect p50/p99 "
                     f"{s['effect_ms']['p50']}/"
                     f"{s['effect_ms']['p99']} ms, recovery p50/p99 {s['recovery_ms']['p50']}/"
                     f"{s['recovery_ms']['p99']} ms, inject() {s['inject_ms']['p50']} ms, "
                     f"heal() {s['heal_ms']['p50']} ms"
                     + (f", {s['not_seen']} not seen" if s["not_seen"] else "")
                     + (f", {s['not_recovered']} not recovered" if s["not_recovered"] else ""))
    finally:
        proxy.stop()
        node.stop()
    write_json("faults", out)
    return out


BASELINE_OK = 0.8  # share of healthy probes in the 100 ms before inject()


def summarize(all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over the repetitions whose probe path was healthy before the
    inject (>= 80% of probes answered 200 in under 50 ms): on the shared
    machine the proxy was sometimes starved before anything was injected,
    and such a repetition measures the neighbours, not the fault. The
    excluded ones stay in ``runs`` and are counted."""
    rows = [x for x in all_rows if (x.get("baseline_healthy") or 0) >= BASELINE_OK]
    out: dict[str, Any] = {"runs": all_rows, "judged": len(rows),
                           "excluded_unhealthy_baseline": len(all_rows) - len(rows)}
    for key in ("inject_ms", "heal_ms", "effect_ms", "effect_detect_ms", "recovery_ms",
                "recovery_detect_ms"):
        xs = [x[key] for x in rows if x[key] is not None]
        out[key] = {"p50": r(pct(xs, 50)), "p99": r(pct(xs, 99)), "max": r(max(xs) if xs else None),
                    "n": len(xs)}
    for key in ("effect_steady", "recovery_steady", "baseline_healthy"):
        xs = [x[key] for x in rows if x[key] is not None]
        out[key] = r(sum(xs) / len(xs), 3) if xs else None
    out["not_seen"] = sum(1 for x in rows if x["effect_ms"] is None)
    out["not_recovered"] = sum(1 for x in rows if x["recovery_ms"] is None)
    # The goal is on what a user waits for: until the fault is in effect
    # (inject's own time plus the effect latency), and the same for the heal.
    tot_in = [x["inject_ms"] + x["effect_ms"] for x in rows if x["effect_ms"] is not None]
    tot_out = [x["heal_ms"] + x["recovery_ms"] for x in rows if x["recovery_ms"] is not None]
    out["inject_to_effect_ms"] = {"p50": r(pct(tot_in, 50)), "p99": r(pct(tot_in, 99))}
    out["heal_to_recovery_ms"] = {"p50": r(pct(tot_out, 50)), "p99": r(pct(tot_out, 99))}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--kinds", nargs="*", default=None, choices=list(KINDS))
    a = ap.parse_args()
    run(a.quick, a.reps, a.kinds)
