"""The Triton engine under GPU faults (runs.gpu_scenario), on a real GPU.

The pure part (how a gRPC failure is classified) runs everywhere. The run
needs an NVIDIA GPU with NVML, torch with CUDA, and nvidia-pytriton (with
tritonclient[grpc]); it skips elsewhere, naming what is missing. It runs a
short schedule (throttle, memory pressure, pause, kill) and checks that each
fault was seen where it should be: reason bits or a lower SM clock under the
throttle, ~60% of device memory used under the pressure, requests refused
during the kill and served again after the restart, memory back after drain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.triton.pytriton import _grpc_error, pytriton_missing
from load.gpu_telemetry import GpuTelemetry


class FakeRpcError(Exception):
    """The shape of grpc.aio.AioRpcError that the classifier reads."""

    def __init__(self, code: str, details: str):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_grpc_failures_are_classified_by_whether_the_request_could_have_run():
    refused = _grpc_error(FakeRpcError("StatusCode.UNAVAILABLE",
                                       "failed to connect to all addresses"), 0)
    assert refused.type == "fail" and "not sent" in refused.error
    cut = _grpc_error(FakeRpcError("StatusCode.UNAVAILABLE", "Stream removed (Socket closed)"), 5)
    assert cut.type == "info" and cut.value["output_tokens"] == 5
    # connect failure after tokens arrived cannot happen; if it says so, it may have run
    assert _grpc_error(FakeRpcError("StatusCode.UNAVAILABLE", "failed to connect"), 2).type == "info"
    loading = _grpc_error(FakeRpcError("StatusCode.INTERNAL",
                                       "Request for unknown model: 'ordeal-tiny' is not found"), 0)
    assert loading.type == "fail" and "refused by the server" in loading.error


def gpu_missing() -> str | None:
    tele = GpuTelemetry.open()
    if not tele.available:
        return tele.reason
    try:
        import torch
    except ImportError:
        return "no CUDA: torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA: torch.cuda.is_available() is False"
    return pytriton_missing()


MISSING = gpu_missing()


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.timeout(420)
def test_triton_on_gpu_under_gpu_faults(tmp_path):
    from runs.gpu_scenario import main

    main(["--out", str(tmp_path), "--rate", "3", "--max-tokens", "16", "32", "--quiet", "8",
          "--hold", "8", "--pause", "3", "--after-heal", "8", "--memory-fraction", "0.6"])
    summary = json.loads(next(Path(tmp_path).glob("*/summary.json")).read_text())
    by_name = {r["name"]: r for r in summary["invariants"]}
    phases: dict[str, dict] = {}
    for p in summary["gpu"]["phases"]:
        phases.setdefault(p["phase"], p)  # the first "steady" is the one before any fault
    print("[figures]", json.dumps({k: {m: p.get(m) for m in ("ttft_ms_p50", "tpot_ms_p50",
                                                            "requests_ok", "requests_fail",
                                                            "gpu")}
                                   for k, p in phases.items()}), flush=True)
    steady, throttle = phases["steady"], phases["gpu_throttle@triton-0"]
    g = throttle["gpu"]
    assert g["util_gpu_pct_median"] >= 90, g
    assert g["sm_clock_mhz_min"] < g["sm_clock_max_mhz"] or "SwPowerCap" in g["reasons_seen"], g
    total = GpuTelemetry.open().read()[0]["gpu"]["mem_total_mb"]
    pressure = phases["gpu_memory_pressure@triton-0"]["gpu"]
    assert pressure["mem_used_mb_max"] - steady["gpu"]["mem_used_mb_max"] > 0.55 * total, \
        (pressure, total)
    # refused while the only replica was down (some sent after it was ready again, but
    # before the heal's end op, may be served: 2 were on the H200)
    assert phases["process_kill@triton-0"]["requests_fail"] > 0
    assert phases["after process_kill@triton-0"]["requests_ok"] > 0
    for name in ("no_silent_loss", "restart_readiness", "gpu_memory_back", "error_rate"):
        assert by_name[name]["valid"] is True, by_name[name]
    # the scenario's default warm-up (5 s) is its own phase, out of the steady baseline
    assert summary["settings"]["warmup_s"] == 5.0 and phases["warmup"]["requests_ok"] > 0
    assert by_name["throttle_explained"]["details"]["warmup_requests"] > 0
    assert summary["gpu_throttle_effect"][0]["during"]["sm_clock_mhz_min"] > 0
