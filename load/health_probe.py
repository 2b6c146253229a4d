"""The full-chain health probe: router, every replica, the model, the GPU.

Once a second through a whole run, every check at once, each with its own
deadline: a partitioned or paused node costs its own check a "timeout", and
never delays the answer about the others. So one probe answers in under half
a second whatever is broken, and says which part is (testcontainers' wait
strategies, but for a running cluster).

It runs on a thread and an event loop of its own, so a busy load generator
cannot delay it either. Each probe is one JSON line of ``health.jsonl`` in
the run directory: ISO 8601 time, total milliseconds, one entry per check
(node, what, status, ms, detail) and the engines' fingerprints.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ordeal.history.ops import utc_iso

#: Each check's own deadline; the probe's bar is 500 ms end to end.
CHECK_DEADLINE_S = 0.4
BAR_MS = 500.0


@dataclass(frozen=True)
class Check:
    node: str
    what: str      # "health", "model", "gpu"
    status: str    # "ok", "timeout", "down" (refused, 5xx, wrong answer), "absent"
    ms: float
    detail: str | None = None


async def http_check(session: aiohttp.ClientSession, node: str, what: str, url: str,
                     deadline_s: float, want_model: str | None = None, ssl: Any = True,
                     headers: dict[str, str] | None = None) -> Check:
    """One check. ``ssl`` and ``headers``: an external deployment's [tls]
    context, and its API key and headers (for /v1/models only). A redirect
    is an answer (not followed: it may lead off the allowed hosts)."""
    t0 = time.monotonic()

    def ms() -> float:
        return round((time.monotonic() - t0) * 1000, 1)
    try:
        async with asyncio.timeout(deadline_s):
            async with session.get(url, ssl=ssl, headers=headers,
                                   allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return Check(node, what, "down", ms(), f"HTTP {resp.status}")
                if want_model is not None:
                    ids = [m.get("id") for m in json.loads(body).get("data", [])]
                    if want_model not in ids:
                        return Check(node, what, "down", ms(), f"model {want_model} not in {ids}")
                return Check(node, what, "ok", ms())
    except TimeoutError:
        return Check(node, what, "timeout", ms(), f"no answer in {deadline_s * 1000:.0f} ms")
    except (aiohttp.ClientError, OSError, ValueError, AttributeError) as e:
        return Check(node, what, "down", ms(), f"{type(e).__name__}: {e}"[:200])


async def gpu_check(gpu: Any, deadline_s: float) -> list[Check]:
    """NVML, on a worker thread with the same deadline (a wedged driver
    hangs NVML calls); "absent" on a machine without NVIDIA GPUs."""
    if gpu is None or not getattr(gpu, "available", False):
        return [Check("gpu", "gpu", "absent", 0.0, "no NVML on this machine")]
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(deadline_s):
            readings = await asyncio.to_thread(gpu.read, False)
    except TimeoutError:
        return [Check("gpu", "gpu", "timeout", round((time.monotonic() - t0) * 1000, 1))]
    except Exception as e:  # noqa: BLE001 - reported as the GPU's state
        return [Check("gpu", "gpu", "down", round((time.monotonic() - t0) * 1000, 1),
                      f"{type(e).__name__}: {e}"[:200])]
    ms = round((time.monotonic() - t0) * 1000, 1)
    return [Check(f"gpu{r.get('index', i)}", "gpu", "ok" if not r.get("error") else "down", ms,
                  r.get("error")) for i, r in enumerate(readings)]


class HealthProbe:
    def __init__(self, cluster: Any, path: Path, model: str, interval_s: float = 1.0,
                 deadline_s: float = CHECK_DEADLINE_S, gpu: Any = None):
        self.cluster = cluster
        self.model = model  # the served model name each replica's /v1/models must list
        self.path = Path(path)
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self.gpu = gpu
        self.elapsed_ms: list[float] = []
        self.statuses: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def targets(self) -> list[tuple[str, str, str, str | None]]:
        """(node, what, url, model wanted) for every check of one probe."""
        out = []
        for node in self.cluster.nodes:
            url = node.endpoint.url
            health = getattr(node, "health_url", None) or f"{url}/health"
            out.append((node.name, "health", health, None))
            if node.role == "replica":
                ready = getattr(node, "model_ready_url", None)  # an engine's own (Triton)
                out.append((node.name, "model", ready, None) if ready else
                           (node.name, "model", f"{url}/v1/models", self.model))
        return out

    async def probe_once(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        t0 = time.monotonic()
        nodes = {n.name: n for n in self.cluster.nodes}
        options = getattr(self.cluster, "client_options", None)
        model_headers = ({k: v for k, v in options.session_headers().items() if k != "Host"}
                         if options is not None else None)
        checks = [http_check(session, n, w, u, self.deadline_s, m,
                             ssl=getattr(nodes.get(n), "ssl_context", None) or True,
                             headers=model_headers if w == "model" else None)
                  for n, w, u, m in self.targets()]
        results: list[Check] = list(await asyncio.gather(*checks))
        results += await gpu_check(self.gpu, self.deadline_s)
        elapsed = round((time.monotonic() - t0) * 1000, 1)
        return {"time": utc_iso(), "elapsed_ms": elapsed,
                "checks": [asdict(c) for c in results],
                "fingerprints": {n.name: n.fingerprint() for n in self.cluster.nodes}}

    def _note(self, record: dict[str, Any]) -> None:
        self.elapsed_ms.append(record["elapsed_ms"])
        for c in record["checks"]:
            key = f"{c['node']}/{c['what']}"
            per = self.statuses.setdefault(key, {})
            per[c["status"]] = per.get(c["status"], 0) + 1

    async def _run(self) -> None:
        # A fresh connection per check: a pooled one to a paused node would
        # hold its slot, and the probe must see each node as a client would.
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            with self.path.open("a", encoding="utf-8") as out:
                while not self._stop.is_set():
                    started = time.monotonic()
                    record = await self.probe_once(session)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    self._note(record)
                    rest = self.interval_s - (time.monotonic() - started)
                    if rest > 0:
                        await asyncio.sleep(rest)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as e:  # noqa: BLE001 - the run goes on; the summary says why
            self.error = f"health probe stopped: {type(e).__name__}: {e}"

    def start(self) -> "HealthProbe":
        self._thread = threading.Thread(target=self._main, name="ordeal-health-probe",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "HealthProbe":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """For summary.json: how fast the probe answered (p50, p99, max; the
        bar is 500 ms) and what each check said how often."""
        xs = sorted(self.elapsed_ms)
        if not xs:
            return {"probes": 0, "error": self.error, "file": self.path.name}
        p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
        return {"probes": len(xs), "file": self.path.name,
                "p50_ms": statistics.median(xs), "p99_ms": p99, "max_ms": xs[-1],
                "bar_ms": BAR_MS, "under_bar": p99 < BAR_MS, "checks": self.statuses,
                "error": self.error}
