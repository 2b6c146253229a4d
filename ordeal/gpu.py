"""GPU vocabulary every layer shares: NVML's clocks-event (throttle) reason
bits and their names. Pure data, no NVML import: reports and checkers decode
what the monitor recorded on a GPU machine, on any machine.

The bits are NVML's ``nvmlClocksEventReason*`` (formerly
``nvmlClocksThrottleReason*``) constants from nvml.h.
"""

from __future__ import annotations

REASON_BITS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}

#: Reasons that mean "slowed by power or heat": what a throttle by load shows.
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def reason_names(bits: int) -> list[str]:
    """Names of the bits set in ``bits``, lowest first; an unknown bit is
    named by its hex value so nothing is hidden."""
    if bits < 0:
        return ["unsupported"]
    names = []
    for bit in range(0, max(bits.bit_length(), 1)):
        mask = 1 << bit
        if bits & mask:
            names.append(REASON_BITS.get(mask, hex(mask)))
    return names


def is_slowdown(bits: int) -> bool:
    """True when a power or thermal reason is set (not idle, not a setting)."""
    return bits > 0 and bool(bits & SLOWDOWN_MASK)
