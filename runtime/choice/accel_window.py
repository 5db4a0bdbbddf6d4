"""One measuring window on an accelerator's own meter, sized to the meter's resolution.

The profiler (runtime/choice/profiler.py) bills a variant on a metered accelerator its
meter's energy above idle over the window. NVML's counter moves in steps (~100 ms): a window
of a few ms read nothing or one step, and the same variant read 31.8 mJ in a quick round and
393 mJ refined (REFERENCE.md, the lent H200). So a window here:

- is at least the meter's `min_window_s` long (power/meter_resolution.py: quantisation error
  under 5 %), whatever the round's own length, capped at MAX_WINDOW_S;
- on a counter, starts at a tick (it waits for the counter to change, idle) and ends at a
  tick (inference goes on until the counter changes once the window is long enough), so the
  two readings are the energy at the window's own edges, not up to a period stale;
- keeps the readings it saw (at most one per POLL_S) and asks power/meter_trust.py whether
  they can be believed.

`gap_w` then measures what the device draws above idle in the gap after a kernel: the
active-idle power a GPU keeps between frames at a cadence (128-137 W against 81 W idle at
3-4 % utilisation on the H200), from which runtime/choice/at_rate.py bills a frame at the
served rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from power import meter_trust
from power.meter_resolution import POLL_S

MAX_WINDOW_S = 10.0  # the longest window a meter's resolution may ask for (then: its error)


class AccelWindow:
    """A window on `meter` (power.nvml.NvmlMeter or alike: `resolution()`, `counter_mj()`,
    `energy_j()`, `needs_samples`). Call `start()`, `enough()` after every inference until it
    says so, then `finish()`."""

    def __init__(self, meter: Any, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep,
                 max_window_s: float = MAX_WINDOW_S):
        self.meter, self._clock, self._sleep = meter, clock, sleep
        self.res = meter.resolution()
        # a meter whose period could not be measured cannot size a window: the round's own
        # length is used and the figure's error is unknown (provisional, runtime/choice/
        # provisional.py)
        need = self.res.min_window_s()
        self.need_s = min(need, max_window_s) if math.isfinite(need) else 0.0
        period = self.res.period_s
        self.aligned = (not meter.needs_samples and period is not None
                        and math.isfinite(period) and period > 0)
        self.readings: list[tuple[float, float]] = []  # (t, J), for meter_trust
        self._t0 = self._last_poll = 0.0
        self._mark: float | None = None  # the counter when the window became long enough

    def _read(self) -> float:
        """Cumulative J: the raw counter where aligned, else the (integrating) meter."""
        return self.meter.counter_mj() / 1e3 if self.aligned else self.meter.energy_j()

    def _await_tick(self, limit_s: float) -> tuple[float, float]:
        """Poll until the counter changes (at most `limit_s`): (time, J) just after it did."""
        t, v = self._clock(), self._read()
        end = t + limit_s
        while self._clock() < end:
            self._sleep(POLL_S)
            t2, v2 = self._clock(), self._read()
            if v2 != v:
                return t2, v2
        return self._clock(), self._read()

    def start(self) -> None:
        """Open the window (at the counter's next tick where it is a counter)."""
        if self.aligned:
            t, v = self._await_tick(2 * self.res.period_s)  # type: ignore[operator]
        else:
            t, v = self._clock(), self._read()
        self._t0 = self._last_poll = t
        self.readings = [(t, v)]
        self._polled = (t, v)  # the last poll

    def enough(self) -> bool:
        """After an inference: whether the window may close (long enough and, on a counter,
        the counter just ticked). A counter that does not tick for 2 windows closes it anyway
        (`problem` then says it is stuck)."""
        now = self._clock()
        if self.meter.needs_samples:
            self.meter.energy_j()  # an integrating meter needs samples
        span = now - self._t0
        if now - self._last_poll < POLL_S and span < self.need_s:
            return False
        self._last_poll = now
        v = self._read()
        self._polled = (now, v)
        if v != self.readings[-1][1]:
            self.readings.append((now, v))
        if span < self.need_s:
            return False
        if not self.aligned:
            return True
        if self._mark is None:
            self._mark = self.readings[-1][1]
            return False
        return v != self._mark or span > 2 * self.need_s + 1.0

    def finish(self) -> tuple[float, float]:
        """(joules, seconds) over the window, edge to edge."""
        if not self.aligned:
            self.readings.append((self._clock(), self._read()))
        elif self._polled[0] > self.readings[-1][0]:  # closed without a tick: stuck
            self.readings.append(self._polled)
        t, v = self.readings[-1]
        return v - self.readings[0][1], t - self._t0

    def problem(self) -> str | None:
        """Why the window's readings cannot be trusted (power/meter_trust.py), or None."""
        return meter_trust.problem(self.readings, self.res.period_s)

    def error(self) -> float:
        """The window's relative quantisation error: a poll's lag at each edge where aligned,
        else the meter's resolution over the window."""
        t = self.readings[-1][0] - self._t0
        if t <= 0:
            return math.inf
        return 2 * POLL_S / t if self.aligned else self.res.error(t)

    def gap_w(self, idle_w: float) -> float | None:
        """Right after `finish`: the device's power above `idle_w` over the next `need_s` with
        nothing running (the active-idle power it keeps between frames); None when the meter
        did not move (then unknown, not 0)."""
        t0, v0 = self.readings[-1]
        if not self.aligned:
            t0, v0 = self._clock(), self._read()
        end = t0 + self.need_s
        while self._clock() < end:
            self._sleep(min(0.05, max(end - self._clock(), 0.0)))
            if self.meter.needs_samples:
                self.meter.energy_j()
        t1, v1 = (self._await_tick(2 * self.res.period_s) if self.aligned  # type: ignore[operator]
                  else (self._clock(), self._read()))
        if v1 <= v0 or t1 <= t0:
            return None
        return max((v1 - v0) / (t1 - t0) - idle_w, 0.0)
