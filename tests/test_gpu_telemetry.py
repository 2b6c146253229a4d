"""GPU telemetry: the pure parts (reason names, the reading's shape, the
report's phases, the gpu_memory_back checker, report.html drawing) run
everywhere; the NVML parts run on a machine with an NVIDIA GPU and skip
elsewhere, naming what is missing."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import pytest

from invariants.base import RunContext
from invariants.gpu import GpuMemoryBack
from invariants.settings import CheckerSettings, SLOTargets
from load.gpu_telemetry import GpuTelemetry, reading_value
from load.monitor import Monitor
from ordeal.gpu import is_slowdown, reason_names
from ordeal.history.ops import Op
from ordeal.history.reader import read_history
from ordeal.history.writer import History
from reports.gpu import gpu_phases, throttle_effect
from reports.html import render_report
from reports.run_dir import RunDir

S = 1_000_000_000


def test_reason_names_decode_nvml_bits():
    assert reason_names(0) == []
    assert reason_names(0x1) == ["GpuIdle"]
    assert reason_names(0x4 | 0x20) == ["SwPowerCap", "SwThermalSlowdown"]
    assert reason_names(0x1000) == ["0x1000"]  # unknown bits are named, not dropped
    assert reason_names(-1) == ["unsupported"]
    assert is_slowdown(0x4) and is_slowdown(0x41) and not is_slowdown(0x1) and not is_slowdown(0)


def test_reading_value_puts_numbers_first_and_names_reasons():
    raw = {"power_w": 650.0, "sm_clock_mhz": 1215, "clocks_event_reasons": 0x4,
           "mem_used_mb": 1625, "xid_events_total": 0, "temp_c": 40}
    v = reading_value(0, "NVIDIA H200", raw, [79], {"123": 500})
    assert list(v["gpu"])[:3] == ["sm_clock_mhz", "clocks_event_reasons", "mem_used_mb"]
    assert v["reasons"] == ["SwPowerCap"] and v["xids"] == [79] and v["procs_mb"] == {"123": 500}


def gpu_op(i, t, clock, bits, mem, phase="sample"):
    return Op(i, int(t * S), "w", "info", "monitor", "gpu",
              {"phase": phase, "device": 0, "name": "G",
               "gpu": {"sm_clock_mhz": clock, "clocks_event_reasons": bits, "mem_used_mb": mem,
                       "util_gpu_pct": 50, "power_w": 100.0}})


def req_ops(i, t, proc, ttft):
    return [Op(i, int(t * S), "w", "invoke", proc, "generate", {}),
            Op(i + 1, int((t + 0.1) * S), "w", "ok", proc, "generate",
               {"ttft_ms": ttft, "tpot_ms": ttft / 10, "e2e_ms": ttft * 3})]


def nem(i, t, f, phase):
    return Op(i, int(t * S), "w", "info", "nemesis", f,
              {"kind": "gpu_throttle", "target": "n", "phase": phase})


def synthetic_history():
    ops = [gpu_op(0, 0, 1980, 0x0, 1600), *req_ops(1, 0.5, 1, 5.0),
           nem(3, 1, "inject", "begin"), nem(4, 1.5, "inject", "end"),
           gpu_op(5, 2, 1200, 0x4, 9000), *req_ops(6, 2.5, 2, 50.0),
           nem(8, 3, "heal", "begin"), nem(9, 3.2, "heal", "end"),
           gpu_op(10, 4, 1970, 0x0, 1610), *req_ops(11, 4.5, 3, 6.0),
           gpu_op(13, 20, 1980, 0x1, 1620, "drain")]
    return ops


def test_gpu_phases_show_the_throttle_its_effect_and_the_recovery():
    out = gpu_phases(synthetic_history(), after_heal_s=5.0)
    names = [p["phase"] for p in out["phases"]]
    assert names[:3] == ["steady", "gpu_throttle@n", "after gpu_throttle@n"], names
    steady, during, after = out["phases"][:3]
    assert during["gpu"]["sm_clock_mhz_min"] == 1200 and during["gpu"]["reasons_seen"] == ["SwPowerCap"]
    assert during["ttft_ms_p50"] == 50.0 and steady["ttft_ms_p50"] == 5.0
    assert after["gpu"]["sm_clock_mhz_median"] == 1970 and after["ttft_ms_p50"] == 6.0
    eff = throttle_effect(out["phases"])
    assert eff[0]["during"]["reason_bits_seen"] == ["0x4"]
    assert eff[0]["before"]["ttft_ms_p50"] == 5.0 and eff[0]["after"]["ttft_ms_p50"] == 6.0


def run_checker(ops, **settings):
    c = GpuMemoryBack()
    c.start(RunContext(run_id="t", settings=CheckerSettings(**settings)))
    for op in ops:
        c.feed(op)
    return c.result()


def test_gpu_memory_back_passes_fails_and_says_unknown():
    ok = run_checker(synthetic_history())
    assert ok.valid is True and ok.details["devices"]["gpu0"]["peak_mb"] == 9000
    leaked = [*synthetic_history()[:-1], gpu_op(20, 20, 1980, 0x1, 70000, "drain")]
    bad = run_checker(leaked)
    assert bad.valid is False and "above its baseline" in bad.counterexamples[0]["problem"]
    none = run_checker([Op(0, 0, "w", "info", "monitor", "gpu",
                           {"available": False, "reason": "no NVIDIA GPU: x"})])
    assert none.valid == "unknown" and none.details["why_unknown"] == "no NVIDIA GPU: x"


def test_report_draws_gpu_readings_and_the_phase_table(tmp_path):
    rd = RunDir.create(tmp_path, "gpu")
    h = History(rd.history_path)
    for op in synthetic_history():
        h.append(op.type, op.process, op.f, op.value, op.error)
    h.close()
    phases = gpu_phases(read_history(rd.history_path), 5.0)
    rd.write_summary({"run_id": rd.run_id, "verdict": True, "invariants": [], "faults": [],
                      "gpu": phases})
    page = render_report(rd.path).read_text()
    assert "gpu sm_clock_mhz" in page and "gpu clocks_event_reasons" in page
    assert "GPU by phase" in page and "SwPowerCap" in page
    assert "GPU telemetry: none" not in page


def test_no_nvml_is_said_once_in_the_history_not_an_error(tmp_path):
    tele = GpuTelemetry(False, "no NVIDIA GPU: pynvml.nvmlInit failed: test")
    h = History(tmp_path / "h.jsonl")
    m = Monitor([], h, gpu=tele)

    async def twice():
        await m.sample_all()
        await m.sample_all("drain")
    asyncio.run(twice())
    h.close()
    ops = [op for op in read_history(tmp_path / "h.jsonl") if op.f == "gpu"]
    assert len(ops) == 1 and ops[0].error is None
    assert ops[0].value == {"available": False, "reason": "no NVIDIA GPU: pynvml.nvmlInit failed: test"}


# --- on a GPU machine ------------------------------------------------------------

TELE = GpuTelemetry.open()
needs_gpu = pytest.mark.skipif(not TELE.available, reason=TELE.reason or "")


@needs_gpu
@pytest.mark.timeout(120)
def test_nvml_reading_has_every_field_and_sees_a_matmul_load():
    import torch

    idle = TELE.read(procs=True)[0]
    for k in ("sm_clock_mhz", "mem_clock_mhz", "clocks_event_reasons", "util_gpu_pct",
              "mem_used_mb", "power_w", "temp_c", "xid_events_total"):
        assert k in idle["gpu"], (k, idle)
    assert idle["gpu"]["sm_clock_mhz"] > 0 and idle["gpu"]["mem_total_mb"] > 0
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    busy = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
        busy.append(TELE.read(procs=True)[0])
    print("[figures] nvml idle:", json.dumps(idle), "busy:", json.dumps(busy[-1]), flush=True)
    assert statistics.median(b["gpu"]["util_gpu_pct"] for b in busy) >= 90
    assert max(b["gpu"]["power_w"] for b in busy) > idle["gpu"]["power_w"]
    held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # 4 GiB, plain cudaMalloc
    held.fill_(1)
    torch.cuda.synchronize()
    grown = TELE.read()[0]["gpu"]["mem_used_mb"] - idle["gpu"]["mem_used_mb"]
    del held
    torch.cuda.empty_cache()
    assert grown >= 3500, grown


@needs_gpu
@pytest.mark.timeout(60)
def test_monitor_records_gpu_readings_per_round(tmp_path):
    h = History(tmp_path / "h.jsonl")
    m = Monitor([], h, gpu=TELE)

    async def rounds():
        for _ in range(3):
            await m.sample_all()
        await m.sample_all("drain")
    asyncio.run(rounds())
    h.close()
    ops = [op for op in read_history(tmp_path / "h.jsonl") if op.f == "gpu"]
    assert len(ops) == 4 * TELE.count
    assert ops[-1].value["phase"] == "drain" and ops[0].value["gpu"]["mem_total_mb"] > 0
    assert run_checker(ops).valid is True


def run_explained(ops, **settings):
    from invariants.gpu import ThrottleExplained

    c = ThrottleExplained()
    c.start(RunContext(run_id="t", settings=CheckerSettings(
        slo=SLOTargets(ttft_ms=20.0, after_heal_s=2.0), **settings)))
    for op in ops:
        c.feed(op)
    return c.result()


def test_slo_breaches_outside_faults_are_explained_by_a_throttle_reason_or_flagged():
    quiet = [gpu_op(0, 0, 1980, 0x0, 1600), *req_ops(1, 0.5, 1, 5.0)]
    assert run_explained(quiet).valid is True  # no breach at all
    # a slow request in steady state while NVML says SwPowerCap: explained
    explained = [*quiet, gpu_op(3, 1.0, 1400, 0x4, 1600), *req_ops(4, 1.0, 2, 90.0),
                 gpu_op(6, 5.0, 1980, 0x0, 1600)]
    r = run_explained(explained)
    assert r.valid is True and r.details["explained_by_throttle"] == 1, r.details
    # a slow request with no slowdown reason anywhere near it: flagged
    flagged = [*quiet, gpu_op(3, 1.0, 1980, 0x1, 1600), *req_ops(4, 3.0, 2, 90.0),
               gpu_op(6, 9.0, 1980, 0x0, 1600)]
    r = run_explained(flagged)
    assert r.valid is False and r.details["flagged"] == 1 and r.counterexamples[0]["index"] == 5
    # slow inside a fault window: that window's checkers judge it, not this one
    in_fault = [*quiet, nem(3, 1.0, "inject", "begin"), nem(4, 1.1, "inject", "end"),
                *req_ops(5, 1.5, 2, 90.0), nem(7, 2.0, "heal", "begin"),
                nem(8, 2.1, "heal", "end"), gpu_op(9, 9.0, 1980, 0x0, 1600)]
    assert run_explained(in_fault).valid is True
    # breaches but no GPU readings at all: cannot be explained
    r = run_explained(req_ops(0, 0.0, 1, 90.0))
    assert r.valid == "unknown" and "no GPU readings" in r.details["why_unknown"]
