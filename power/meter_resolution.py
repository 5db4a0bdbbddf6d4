"""How fine a power meter is: its update period and averaging, and the window that needs.

An energy meter is read as a difference over a window. A counter that the device updates
every `period_s` (NVML's total-energy counter: ~100 ms on the GPUs seen) is stale by up to
one period at each end of the window, and a power reading averaged over `averaging_s` (NVML's
power on Ampere and later: 1 s) lags the load by up to that: either way the window's energy
is off by up to (period + averaging) x the power. A window of a few milliseconds (a quick
round on a ~4 ms variant) read 31.8 mJ where the refined round read 393 mJ on a lent H200
(REFERENCE.md "Measured on a lent NVIDIA H200"). So every meter declares its `Resolution`,
measured where it can be (`measure_period` polls the reading and times its changes) or taken
from documented intervals, and the profiler makes each window at least `min_window_s` long:
the quantisation error is then under MAX_ERROR.

Where the figures come from:
- NVML counter: measured at start by polling it (`measure_period`).
- NVML power reading: "On Ampere (except GA100) or newer GPUs, the API returns power
  averaged over 1 sec interval. On GA100 and older architectures, instantaneous power is
  returned" (NVML API reference, nvmlDeviceGetPowerUsage): documented 1 s unless the
  architecture is known to be older.
- RAPL: the energy status MSR is updated about every 1 ms (Intel SDM vol. 3B, "RAPL
  interfaces"): documented.
- hwmon / INA3221: the driver's `update_interval` file (ms) where it has one
  (Documentation/hwmon/sysfs-interface.rst; ina3221.rst: the conversion time), else
  measured by polling the power reading.
- estimated: a model, exact at any window (period 0).
Pure but for `measure_period`, which polls through the clock and sleep it is given.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAX_ERROR = 0.05  # the quantisation error a measuring window is sized for
RAPL_PERIOD_S = 1e-3  # Intel SDM: the energy status counter updates about every 1 ms
NVML_POWER_AVERAGING_S = 1.0  # NVML nvmlDeviceGetPowerUsage, Ampere and later
POLL_S = 0.002  # how often `measure_period` reads the meter
MEASURE_MAX_S = 1.5  # longest `measure_period` polls
MIN_CHANGES = 5  # changes `measure_period` times before it answers


@dataclass(frozen=True)
class Resolution:
    """How fine a meter is. `period_s` None: unknown (the meter did not change while it was
    timed); the window is then unbounded by it and `note` says why."""

    period_s: float | None  # how often the reading changes (a counter's update period)
    averaging_s: float = 0.0  # a power reading's averaging window (0: a counter, instant)
    basis: str = "assumed"  # measured | documented | assumed
    note: str = ""

    def min_window_s(self, max_error: float = MAX_ERROR) -> float:
        """The shortest window whose quantisation error is under `max_error` (0: any;
        inf: the period is unknown)."""
        if self.period_s is None:
            return math.inf
        return (self.period_s + self.averaging_s) / max_error

    def error(self, window_s: float) -> float:
        """The worst relative quantisation error of a window of `window_s` seconds."""
        if self.period_s is None or window_s <= 0:
            return math.inf
        return (self.period_s + self.averaging_s) / window_s

    def describe(self) -> str:
        """One line for operators and the bench."""
        if self.period_s is None:
            return f"update period unknown ({self.note or self.basis})"
        if self.period_s == 0 and self.averaging_s == 0:
            return f"exact ({self.basis}{': ' + self.note if self.note else ''})"
        avg = f", averaged over {self.averaging_s:g} s" if self.averaging_s else ""
        return (f"updates every {self.period_s * 1e3:.3g} ms{avg} ({self.basis}"
                f"{': ' + self.note if self.note else ''}); windows >= "
                f"{self.min_window_s():.2g} s for < {MAX_ERROR:.0%} error")


EXACT = Resolution(0.0, 0.0, "model", "an estimate from CPU time")


def period_from_changes(times_s: list[float]) -> float | None:
    """The update period from the times a reading was seen to change: the median interval
    between changes (a poll that lands late on one change makes one interval long and the
    next short; the median is not moved by that). None with fewer than 2 changes. Pure."""
    if len(times_s) < 2:
        return None
    gaps = [b - a for a, b in itertools.pairwise(times_s) if b > a]
    return statistics.median(gaps) if gaps else None


def measure_period(read: Callable[[], float], clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep, max_s: float = MEASURE_MAX_S,
                   poll_s: float = POLL_S, changes: int = MIN_CHANGES) -> Resolution:
    """Time a reading's changes by polling it every `poll_s` for at most `max_s`: its update
    period (measured). A reading that never changes (an idle counter on a coarse meter, or a
    stuck one) has an unknown period, said so."""
    t0 = clock()
    last = read()
    seen: list[float] = []
    while clock() - t0 < max_s and len(seen) <= changes:
        sleep(poll_s)
        v = read()
        if v != last:
            seen.append(clock())
            last = v
    period = period_from_changes(seen)
    if period is None:
        return Resolution(None, basis="measured",
                          note=f"changed {len(seen)} times in {clock() - t0:.1f} s of polling")
    # a poll can only see a change up to poll_s late: a period under that is the poll's
    return Resolution(max(period, poll_s), basis="measured",
                      note=f"{len(seen)} changes timed by polling every {poll_s * 1e3:g} ms")


def hwmon_interval(hwmon_dir: Path) -> Resolution | None:
    """A hwmon device's documented update interval (`update_interval`, ms), or None when the
    driver has no such file or it is garbage."""
    f = hwmon_dir / "update_interval"
    try:
        ms = int(f.read_text().strip())
    except (OSError, ValueError):
        return None
    if not 0 < ms < 60_000:
        return None
    return Resolution(ms / 1e3, basis="documented", note=f"{f.name} {ms} ms")
