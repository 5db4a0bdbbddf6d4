"""The hindsight oracle a thermal policy is judged against: the best rung/rate schedule any
controller could run, knowing the plant and the ambient trajectory in advance, without the die
ever crossing the control trip. Pure (numpy); used by bench/governor.py and the tests.

What it maximises is what the simulator harness tallies (power/closed_loop.run_load): good
inferences (latency within the target) times the rung's accuracy.

How: dynamic programming backwards over fixed intervals, on a grid of case temperatures.
The die is taken at its quasi-steady state over the case (die = case + P * r_die_case): its
time constant is seconds (rpi5: 1 K/W x 5 J/K), an interval is a minute, so the two-node
plant reduces to one node, and over an interval of constant power P at ambient A the case
moves exactly as case' = A + P R + (case - A - P R) e^(-dt / (R C)), R = r_case_amb,
C = c_case (power/plant.py's equations with the die's derivative set to 0). The case moves
monotonically within an interval, so the die's maximum is at one end: the trip is checked
there. Actions are each rung at `rate_levels + 1` evenly spaced rates from 0 to what it can
take of the offered rate. The value between grid points is interpolated linearly.

The quasi-steady die is a relaxation: a real die lags a step up by a few seconds, which a
controller could exploit by a hair; the schedule is otherwise exact at its resolution, and
`resolution_spread` shows that halving the interval, the grid step and the rate step moves
the figure by well under a percent (tests/power/test_governor_day.py).

Where even idle power settles over the trip (physics-bounded), no schedule is feasible: the
oracle then runs the cheapest action (the cheapest rung at rate 0) in that state, as any
controller must, and says so (`bounded_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from power.device import DeviceProfile
from power.rungs import Rung


@dataclass(frozen=True)
class Resolution:
    """How finely the oracle looks: interval (s), case-temperature grid step (°C), rate
    steps per rung."""

    interval_s: float = 60.0
    grid_c: float = 0.05
    rate_levels: int = 32

    def finer(self) -> Resolution:
        """Every step halved."""
        return Resolution(self.interval_s / 2, self.grid_c / 2, self.rate_levels * 2)


@dataclass(frozen=True)
class OracleResult:
    """The best schedule's tally and the schedule itself (one entry per interval)."""

    good_weighted: float  # accuracy-weighted good inferences over the run
    good: float  # good inferences
    rungs: tuple[int, ...]  # the rung run in each interval
    rates_hz: tuple[float, ...]  # ... at this rate
    max_die_c: float  # the highest quasi-steady die temperature on the schedule
    bounded_s: float  # time in states where nothing at all kept the die under the trip

    def time_on(self, interval_s: float) -> dict[int, float]:
        """Seconds the schedule spends on each rung (rate 0 counted as rung -1: idle)."""
        out: dict[int, float] = {}
        for r, hz in zip(self.rungs, self.rates_hz, strict=True):
            key = r if hz > 0 else -1
            out[key] = out.get(key, 0.0) + interval_s
        return out


def _actions(rungs: Sequence[Rung], rate_hz: float, latency_target_s: float,
             levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rung index, rate, dynamic W, accuracy-weighted good inferences per s) per action."""
    idx, rate, dyn, gain = [], [], [], []
    for i, r in enumerate(rungs):
        top = min(rate_hz, r.max_rate_hz())
        good = r.latency_s <= latency_target_s
        for k in range(levels + 1):
            hz = top * k / levels
            idx.append(i)
            rate.append(hz)
            dyn.append(r.energy_j * hz)  # what the plant heats with (run_load)
            gain.append(hz * r.accuracy if good else 0.0)
    return np.array(idx), np.array(rate), np.array(dyn), np.array(gain)


def best_schedule(device: DeviceProfile, rungs: Sequence[Rung],
                  ambient_c: Callable[[float], float], t0: float, duration_s: float,
                  rate_hz: float, latency_target_s: float, limit_c: float | None = None,
                  res: Resolution | None = None) -> OracleResult:
    """The best schedule (module doc) from `t0` (s from midnight) for `duration_s`, frames
    offered at `rate_hz`, the die never above `limit_c` (default: the passive trip)."""
    res = res or Resolution()
    th = device.thermal
    if th is None:
        raise ValueError(f"device profile {device.name} has no [thermal] section")
    m = th.model
    limit = limit_c if limit_c is not None else th.trip("passive").temp_c
    idx, rate, dyn, gain = _actions(rungs, rate_hz, latency_target_s, res.rate_levels)
    power = device.power.idle_w + dyn
    n = max(1, round(duration_s / res.interval_s))
    dt = duration_s / n
    mids = [t0 + (j + 0.5) * dt for j in range(n)]
    ambs = np.array([ambient_c(t) for t in mids])
    lo = min(float(ambs.min()), ambient_c(t0)) - 1.0
    if lo + 1.0 >= limit:
        raise ValueError(f"the ambient ({lo + 1:.1f} °C) reaches the {limit:g} °C limit: no "
                         "schedule keeps the die under it")
    grid = np.arange(lo, limit + res.grid_c, res.grid_c)
    decay = math.exp(-dt / (m.r_case_amb * m.c_case))
    cheapest = int(np.argmin(power))
    value = np.zeros(len(grid))
    policy = np.empty((n, len(grid)), dtype=np.int32)
    for j in range(n - 1, -1, -1):
        c_inf = ambs[j] + power * m.r_case_amb  # (A,)
        c1 = c_inf[None, :] + (grid[:, None] - c_inf[None, :]) * decay  # (G, A)
        die = np.maximum(grid[:, None], c1) + power[None, :] * m.r_die_case
        total = gain[None, :] * dt + np.interp(c1, grid, value)
        feasible = np.where(die <= limit, total, -np.inf)
        best = np.argmax(feasible, axis=1)
        rows = np.arange(len(grid))
        stuck = ~np.isfinite(feasible[rows, best])
        best[stuck] = cheapest  # nothing keeps the die under the trip: the least heat
        policy[j] = best
        value = total[rows, best]
    # Forward: run the schedule from the plant's start (die = case = ambient) on the same
    # one-node model, acting at the choice of the grid point at or above it (the safe side).
    case = ambient_c(t0)
    chosen_r, chosen_hz = [], []
    good = good_w = bounded = 0.0
    max_die = -math.inf
    for j in range(n):
        g = int(np.clip(np.searchsorted(grid, case), 0, len(grid) - 1))
        a = int(policy[j, g])
        c_inf = ambs[j] + power[a] * m.r_case_amb
        c1 = c_inf + (case - c_inf) * decay
        die = max(case, c1) + power[a] * m.r_die_case
        if die > limit + 1e-9:
            bounded += dt
        max_die = max(max_die, die)
        hz = float(rate[a])
        r = rungs[int(idx[a])]
        if r.latency_s <= latency_target_s:
            good += hz * dt
            good_w += hz * dt * r.accuracy
        chosen_r.append(int(idx[a]))
        chosen_hz.append(hz)
        case = c1
    return OracleResult(good_w, good, tuple(chosen_r), tuple(chosen_hz), max_die, bounded)


def resolution_spread(device: DeviceProfile, rungs: Sequence[Rung],
                      ambient_c: Callable[[float], float], t0: float, duration_s: float,
                      rate_hz: float, latency_target_s: float,
                      res: Resolution | None = None) -> float:
    """|finer / this - 1|: how much the oracle's figure moves when every step is halved."""
    res = res or Resolution()
    a = best_schedule(device, rungs, ambient_c, t0, duration_s, rate_hz, latency_target_s,
                      res=res)
    b = best_schedule(device, rungs, ambient_c, t0, duration_s, rate_hz, latency_target_s,
                      res=res.finer())
    return abs(b.good_weighted / a.good_weighted - 1) if a.good_weighted else 0.0
