"""Whether an accelerator is throttled, as the device itself says. Pure but for `read_devfreq`.

The slow-inference check compares served latency with the profile's. On the host CPU, CPU
time per inference tells throttling (more CPU time for the same work) from queueing (late in
wall time only). On an accelerator host CPU time cannot tell (the lent H200: served p95
5.83 ms against 3.73 ms profiled was frames queueing behind each other, and the daemon said
"throttling?"). The device can:

- NVML's clock-event reasons (nvmlDeviceGetCurrentClocksEventReasons, bitmask; NVML API
  reference "NvmlClocksEventReasons"): software power cap 0x4, hardware slowdown 0x8,
  software thermal slowdown 0x20, hardware thermal slowdown 0x40, hardware power brake 0x80
  are throttling; GPU idle 0x1, application clocks 0x2, sync boost 0x10 and display clocks
  0x100 are not.
- devfreq (SoC GPUs such as Jetson's): `cur_freq` against `max_freq` (Hz). A frequency under
  DEVFREQ_THROTTLED x max is taken as held down. A load-following governor also lowers it at
  light load, so this reads "possibly throttled" and is only asked while inference is slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

THROTTLE_BITS = {0x4: "software power cap", 0x8: "hardware slowdown",
                 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                 0x80: "hardware power brake"}
IDLE_BIT = 0x1
DEVFREQ_THROTTLED = 0.9


@dataclass(frozen=True)
class DeviceState:
    """What the device says about its clocks: throttled or not, and in words."""

    throttled: bool
    why: str


def from_nvml_reasons(mask: int) -> DeviceState:
    """The state an NVML clock-event reasons bitmask says."""
    named = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    if named:
        return DeviceState(True, f"NVML clock events: {', '.join(named)} (0x{mask:x})")
    idle = " (GPU idle)" if mask & IDLE_BIT else ""
    return DeviceState(False, f"NVML clock events: no slowdown{idle} (0x{mask:x})")


def from_devfreq(cur_hz: int, max_hz: int) -> DeviceState | None:
    """The state devfreq's current and maximum frequency say (None: garbage)."""
    if cur_hz <= 0 or max_hz <= 0 or cur_hz > 2 * max_hz:
        return None
    ratio = cur_hz / max_hz
    held = ratio < DEVFREQ_THROTTLED
    return DeviceState(held, f"devfreq {cur_hz / 1e6:.0f} of {max_hz / 1e6:.0f} MHz"
                       + (" (held down)" if held else ""))


def read_devfreq(dev: Path) -> DeviceState | None:
    """A devfreq device directory's state (None when its files are missing or garbage)."""
    try:
        cur = int((dev / "cur_freq").read_text().strip())
        top = int((dev / "max_freq").read_text().strip())
    except (OSError, ValueError):
        return None
    return from_devfreq(cur, top)
