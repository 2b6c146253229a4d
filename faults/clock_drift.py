"""clock_drift: move a node's wall clock (offset, drift, or strobe).

A node started under libfaketime (``ordeal.faketime``: the environment and
the control file, shared with the engines and backends that start nodes)
reads its wall clock through a small control file; this fault rewrites that
file. Facts measured
on this machine with the ``libfaketime`` 3.0.1 wheel (see the tests):

- Only the wall clock moves: FAKETIME_DONT_FAKE_MONOTONIC=1. A real host's
  clock error (a bad NTP step, a drifting RTC) moves CLOCK_REALTIME, never
  CLOCK_MONOTONIC; vLLM and asyncio schedule, time out and measure latency
  with the monotonic clock, and a faked monotonic clock would jump backwards
  under a negative offset or a strobe, which no real host does.
- libfaketime keeps a rate once one was set: after "+0 x2" the file "+0"
  still runs the clock at twice speed (parse_ft_string only sets the rate
  when it sees an "x"). Heal therefore writes ``NEUTRAL`` = "+0 x1", which
  restores the real clock and rate; "+0" is only the initial content.
- A rate is applied from the process's own start (fake = start +
  (now - start) * rate + offset), so "+0 x1.5" written an hour after start
  jumps the clock by half an hour. Drift mode compensates for the node's
  lead process (the API server, whose clock stamps ``created``): at
  injection its clock is off by exactly ``offset_s`` and then drifts.
  Child processes started later are off by (rate-1) x their start delay.
- With a rate set, libfaketime also scales relative sleeps and poll
  timeouts by 1/rate (whether or not the monotonic clock is faked), so in
  drift mode the node's timers run fast or slow too, as on a host whose
  oscillator is off.
- libfaketime re-reads the file at most every FAKETIME_CACHE_DURATION
  seconds (whole seconds); see ``CACHE_DURATION_S`` for the measured choice.
- FAKETIME_FORCE_MONOTONIC_FIX=0 is required for speed (``faketime_env``).

The effect is confirmed from the node's clock as the node reports it: just
before the heal, ``observe`` asks the node's own URL once (``probe_clock``:
the ``created`` stamp of GET /v1/models, else the HTTP ``Date`` header) and
records how far that clock is off the harness's, so a window no request of
the load reached is judged too (invariants.fault_effective also reads the
``created`` stamps of the answers that landed on the node).
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ordeal.faketime import CACHE_DURATION_S, read_clock, write_clock
from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.topology import Node

from .base import Effect, Fault, FaultError, healed
from .cotenant import Helper, end_helper, new_tag, proc_start_time, ready_info, spawn_helper
from .ledger import Ledger, LedgerEntry
from .safety import require_running

NEUTRAL = "+0 x1"  # real time, real rate (a bare "+0" would keep an earlier rate)
#: libfaketime compares whole seconds, so a change takes effect within this
#: (seen: 0.2 to 2 s).
EFFECT_DELAY_S = CACHE_DURATION_S + 1
MODES = ("offset", "drift", "strobe")
#: The probe of a node's clock (``probe_clock``): where, how long it waits,
#: how much of the answer it reads.
PROBE_PATH = "/v1/models"
PROBE_TIMEOUT_S = 2.0
PROBE_MAX_BYTES = 1 << 16


def probe_clock(url: str, timeout: float = PROBE_TIMEOUT_S, context: Any = None
                ) -> dict[str, Any]:
    """The node's wall clock as it reports it, minus this harness's: one GET
    of ``url`` + ``PROBE_PATH``. vLLM stamps each model card of the answer
    with its API server's ``int(time.time())`` (``created``, read through
    libfaketime like every answer's stamp); any other answer (an error
    status included) is read for its HTTP ``Date`` header. Both are whole
    seconds: +0.5 takes out the truncation's bias; the harness's time is the
    request's middle. Never raises: ``{"url", "error"}`` when no clock was
    read, else ``{"url", "skew_s", "source", "rtt_s"}``."""
    target = url.rstrip("/") + PROBE_PATH
    t0, m0 = time.time(), time.monotonic()
    body, date = b"", None
    try:
        try:
            with urllib.request.urlopen(target, timeout=timeout, context=context) as resp:
                date = resp.headers.get("Date")
                body = resp.read(PROBE_MAX_BYTES)
        except urllib.error.HTTPError as e:  # an error status still carries the server's Date
            with e:
                date = e.headers.get("Date") if e.headers else None
        t1, m1 = time.time(), time.monotonic()
        theirs, source = _created(body), "created"
        if theirs is None and date:
            theirs, source = email.utils.parsedate_to_datetime(date).timestamp(), "date"
    except Exception as e:  # noqa: BLE001 - a probe that fails is no evidence, never an error
        return {"url": target, "error": f"{type(e).__name__}: {e}"}
    if theirs is None:
        return {"url": target, "error": "the answer carried no clock (no 'created' stamp, "
                                        "no Date header)"}
    return {"url": target, "skew_s": round(theirs + 0.5 - (t0 + t1) / 2, 2),
            "source": source, "rtt_s": round(m1 - m0, 3)}


def _created(body: bytes) -> float | None:
    """The first ``created`` stamp of an OpenAI model list, or None."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    created = first.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        return None
    return float(created)


def moved_threshold_s(offset_s: float) -> float:
    """The skew that shows a clock fault of ``offset_s`` took effect: half
    the offset, between 1 and 2 s (the stamps are whole seconds). The same
    rule as invariants.fault_effective ``clock_threshold_s``, which judges."""
    return max(1.0, min(2.0, abs(offset_s) / 2)) if offset_s else 2.0


def is_neutral(spec: str) -> bool:
    return spec.split() in (["+0"], ["+0", "x1"], ["+0", "x1.0"])


def offset_spec(offset_s: float) -> str:
    """An offset at real rate. The explicit "x1" matters: a process that
    never saw the neutral spec between two faults (it re-reads the file only
    every cache period) would otherwise keep the previous fault's rate."""
    return f"{offset_s:+g} x1"


def drift_spec(offset_s: float, rate: float, since_start_s: float) -> str:
    """Spec whose clock is ``offset_s`` off now and then runs at ``rate``,
    for a process that started ``since_start_s`` ago (module docstring)."""
    return f"{offset_s - (rate - 1.0) * since_start_s:+.3f} x{rate:g}"


def process_age_s(pid: int) -> float:
    """How long a process has run, on the boot-time clock (its start in
    /proc is counted from boot): a wall clock stepped meanwhile (NTP, an
    operator, this very fault on our own host) does not change it."""
    start = proc_start_time(pid)
    if start is None:
        raise FaultError(f"clock_drift: process {pid} is gone; is the node running?")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - int(start) / os.sysconf("SC_CLK_TCK")


def lead_pid(node: Node) -> int:
    """The node's group leader (for a LocalNode: the vLLM API server)."""
    pids = node.pids()
    if not pids:
        raise FaultError(f"clock_drift: {node.name} has no live process")
    pgid = os.getpgid(pids[0])
    return pgid if pgid in pids else min(pids)


class ClockDrift(Fault):
    kind = "clock_drift"
    traits = KindTraits(kind, hookable=True, observed_in_answers=True,
                        endurance=EnduranceChoice("one", {"mode": "offset", "offset_s": 3600},
                                                  position=5))
    needs_root = False
    privilege = (
        "rewrites the node's libfaketime control file, which the suite created when it "
        "started the node under LD_PRELOAD=libfaketime; it never sets the host's clock, "
        'so it needs write access to that file, not root')

    def __init__(self, node: Node, run_id: str, ledger: Ledger, mode: str = "offset",
                 offset_s: float = 3600.0, rate: float = 1.5, strobe_period_s: float = 4.0):
        super().__init__(node.name, run_id, ledger)
        self.node = node
        self.mode = mode
        self.offset_s = offset_s
        self.rate = rate
        self.strobe_period_s = strobe_period_s
        self.tag = new_tag()
        self.strober: Helper | None = None
        self._injected_at: float | None = None  # monotonic, when the clock file was written

    def _preflight(self) -> None:
        if self.mode not in MODES:
            raise FaultError(f"clock_drift: mode {self.mode!r} is not one of {MODES}")
        if self.mode == "drift" and (self.rate <= 0 or self.rate == 1):
            raise FaultError(f"clock_drift: drift needs a rate > 0 other than 1, not {self.rate}")
        if self.mode in ("offset", "strobe") and self.offset_s == 0:
            raise FaultError(f"clock_drift: {self.mode} with offset_s=0 would change nothing")
        if self.mode == "strobe" and self.strobe_period_s < 2 * EFFECT_DELAY_S:
            raise FaultError(
                f"clock_drift: strobe_period_s={self.strobe_period_s} is shorter than twice "
                f"the {EFFECT_DELAY_S}s a faked process may take to see a change; the node "
                f"would miss flips. Use {2 * EFFECT_DELAY_S}s or more")
        require_running(self.node, self.kind)
        clock_file = self.node.clock_file
        if clock_file is None:
            raise FaultError(
                f"clock_drift: {self.node.name} was not started under libfaketime, so its clock "
                "cannot be moved. Start it with a clock file: VllmReplica(..., "
                "clock_file=Path('<dir>/<node>.clock')) (which sets faults.clock_drift."
                "faketime_env(clock_file) in its environment), then inject again")
        try:
            current = read_clock(clock_file)
        except OSError as e:
            raise FaultError(f"clock_drift: cannot read {self.node.name}'s clock file "
                             f"{clock_file} ({e}); restart the node with a clock_file") from None
        if not is_neutral(current):
            raise FaultError(
                f"clock_drift: {self.node.name}'s clock is already moved (file {clock_file} "
                f"says {current!r}); heal that fault first (python -m faults heal-all)")

    def _inverse(self) -> dict[str, Any]:
        strober = {"tag": self.tag, "pid": None, "start_time": None} \
            if self.mode == "strobe" else None
        return {"clock_file": str(self.node.clock_file), "neutral": NEUTRAL, "strober": strober}

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None and self.node.clock_file is not None
        clock_file = self.node.clock_file
        done: dict[str, Any] = {"mode": self.mode, "clock_file": str(clock_file),
                                "takes_effect_within_s": EFFECT_DELAY_S}
        self._injected_at = time.monotonic()
        if self.mode == "offset":
            spec = offset_spec(self.offset_s)
            write_clock(clock_file, spec)
            return {**done, "spec": spec, "offset_s": self.offset_s}
        if self.mode == "drift":
            since = process_age_s(lead_pid(self.node))
            spec = drift_spec(self.offset_s, self.rate, since)
            write_clock(clock_file, spec)
            return {**done, "spec": spec, "offset_s": self.offset_s, "rate": self.rate,
                    "lead_process_age_s": round(since, 2)}
        argv = [sys.executable, "-m", "faults.clock_drift", "strobe", "--file", str(clock_file),
                "--offset", repr(self.offset_s), "--period", repr(self.strobe_period_s)]
        self.strober = spawn_helper(argv, self.run_id, self.node.name, self.tag)
        self.entry.inverse["strober"] = self.strober.as_dict()
        self.ledger.record(self.entry)  # same id: now with the strober's pid
        return {**done, "spec": f"{offset_spec(self.offset_s)} <-> {NEUTRAL}",
                "offset_s": self.offset_s, "period_s": self.strobe_period_s,
                "strober_pid": self.strober.pid, "ready": ready_info(self.strober)}

    def observe(self) -> Effect:
        """The node's clock as it reports it (``probe_clock``), while the
        fault is in. A probe that sees no move before the node can have
        re-read its clock file (``EFFECT_DELAY_S`` after the inject) waits
        out the rest and asks once more. A strobed clock spends half its
        time at the real time, so a probe that sees no move there proves
        nothing (``inconclusive``). No clock read: effective None, the
        probe's error recorded (fault_effective then says unobserved)."""
        context = getattr(self.node, "ssl_context", None)
        threshold = moved_threshold_s(self.offset_s)
        probe = probe_clock(self.node.endpoint.url, context=context)
        waited = EFFECT_DELAY_S - (time.monotonic() - (self._injected_at or 0.0))
        if waited > 0 and abs(probe.get("skew_s", 0.0)) < threshold:
            time.sleep(waited)
            probe = {**probe_clock(self.node.endpoint.url, context=context),
                     "waited_s": round(waited, 2)}
        evidence: dict[str, Any] = {"probe": probe, "threshold_s": threshold}
        how = (f"the node's clock as it reports it ({PROBE_PATH}: 'created', else the Date "
               "header) against the harness's")
        if "skew_s" not in probe:
            return Effect(None, f"{how}: no clock read", evidence)
        moved = abs(probe["skew_s"]) >= threshold
        if not moved and self.mode == "strobe":
            probe["inconclusive"] = "a strobed clock spends half its time at the real time"
        return Effect(moved, how, evidence)

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """End the strober first (it would rewrite the file), then write the
        neutral spec. A clock file whose directory is gone went with its
        cluster: nothing reads it any more."""
        inverse = entry.inverse
        ended = end_helper(inverse["strober"]) if inverse.get("strober") else []
        clock_file = Path(inverse["clock_file"])
        # A strober killed mid-write leaves its temporary file.
        for stray in clock_file.parent.glob(f".{clock_file.name}.*.tmp"):
            stray.unlink(missing_ok=True)
        if clock_file.exists():
            write_clock(clock_file, inverse.get("neutral", NEUTRAL))
            spec = read_clock(clock_file)
        else:
            spec = "(file gone with its cluster; nothing to restore)"
        return {"clock_file": str(clock_file), "spec": spec, "ended_pids": ended}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return (f"{healed(entry)}: {done['clock_file']} -> {done['spec']!r}"
                + (f", ended strober pid(s) {done['ended_pids']}" if done["ended_pids"] else ""))


def strobe(clock_file: Path, offset_s: float, period_s: float) -> None:
    """Flip the clock between ``offset_s`` and real time every period, for
    ever (the helper process; ended by pid on heal)."""
    specs = (offset_spec(offset_s), NEUTRAL)
    write_clock(clock_file, specs[0])
    print(f"READY strobe file={clock_file} specs={specs[0]!r},{specs[1]!r} period={period_s}",
          flush=True)
    i = 0
    next_flip = time.monotonic() + period_s
    while True:
        time.sleep(max(0.0, next_flip - time.monotonic()))
        i += 1
        write_clock(clock_file, specs[i % 2])
        next_flip += period_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults.clock_drift")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("strobe", help="flip a clock file between an offset and real time")
    s.add_argument("--file", required=True, type=Path)
    s.add_argument("--offset", required=True, type=float)
    s.add_argument("--period", required=True, type=float)
    args = ap.parse_args(argv)
    strobe(args.file, args.offset, args.period)
    return 0


if __name__ == "__main__":
    sys.exit(main())
