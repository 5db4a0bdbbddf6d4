"""Whether a meter's readings over a measuring window can be believed. Pure: tested with tables.

An accelerator's energy counter is read at the start and end of a window, and polled in
between where the window is tick-aligned (runtime/choice/profiler.py). Three kinds of garbage
are distrusted: a counter that did not change for longer than it should (STUCK_PERIODS update
periods, and at least STUCK_MIN_S: a device that works draws power, so its counter moves), one
that went backwards (a driver reload resets NVML's counter), and one that rose faster than any
board can draw (`max_w`; power/box_energy.py's MAX_PLAUSIBLE_W for a whole box). The caller
then bills the labelled estimate instead (power/accelerators.py), never 0, and says so in one
event.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

STUCK_PERIODS = 20  # a counter unchanged for this many update periods is stuck
STUCK_MIN_S = 1.0  # ... and for at least this long (a period measured short by a busy poll)
MAX_W = 2000.0  # more than this from one accelerator's meter is a bad reading


def problem(readings: Sequence[tuple[float, float]], period_s: float | None,
            max_w: float = MAX_W) -> str | None:
    """Why readings (time s, cumulative J), in time order, over one window cannot be trusted;
    None when they can. `period_s` is the meter's update period (None: unknown; the stuck
    check then needs STUCK_MIN_S x STUCK_PERIODS)."""
    if len(readings) < 2:
        return "fewer than two readings"
    for t, v in readings:
        if not (math.isfinite(t) and math.isfinite(v)):
            return f"the meter read {v} at {t:.3f} s"
    stuck_s = max(STUCK_PERIODS * (period_s if period_s else STUCK_MIN_S), STUCK_MIN_S)
    since = readings[0][0]
    for (t0, v0), (t1, v1) in itertools.pairwise(readings):
        if v1 < v0:
            return f"the counter went back by {v0 - v1:.3f} J"
        dt = t1 - t0
        if dt <= 0 and v1 > v0:  # energy with no time to spend it in: no power is plausible
            return f"the counter rose {v1 - v0:.1f} J between two readings at {t1:.3f} s"
        if dt > 0 and (v1 - v0) / dt > max_w:
            return (f"the counter rose {v1 - v0:.1f} J in {dt * 1e3:.0f} ms "
                    f"({(v1 - v0) / dt:.0f} W, more than {max_w:.0f} W)")
        if v1 != v0:
            since = t1
        elif t1 - since > stuck_s:
            return f"the counter did not move for {t1 - since:.1f} s"
    return None
