"""Duty cycling: stay up at a low rate, or sleep between bursts. Pure; table-tested.

On a solar node the inference rate is not the big lever, staying awake is: the solar-node
profile idles at 1.2 W (28.8 Wh/day) whatever it infers. For an inspection schedule (a burst
of `burst` inferences every `every_s`, or at least `per_hour` inferences an hour) the plan
compares, for one period T between bursts:

    stay up:  E_up(T)    = (idle + camera) T + burst e
    sleep:    E_sleep(T) = transition_j + (idle + camera)(warmup + burst t_inf)
                           + idle deliver_s + burst e + suspended (T - awake)

with awake = transition_s + warmup + burst t_inf + deliver_s (resume, camera warm-up, the
burst, and time connected to deliver results and take commands). Sleeping wins when T is
longer than the break-even

    T* = (transition_j + (idle + camera)(warmup + burst t_inf) + idle deliver_s
          - suspended awake) / (idle + camera - suspended).

The energy budget (power/energy.py's planner, run with the suspended draw as the floor: see
`affordable_w`) gives the average power the battery and the harvest forecast allow above
that floor. The plan delivers the requested schedule when either mode affords it, in the
cheaper mode; otherwise the longest-running affordable schedule (bursts further apart), and
with no budget at all one wake every `max_sleep_s` (the check-in that lets commands arrive
and the forecast be re-read), flagged over budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from power import energy as energy_mod
from power.device import DeviceProfile


@dataclass(frozen=True)
class Schedule:
    """What the operator asks for: `burst` inferences every `every_s` seconds, or at least
    `per_hour` inferences an hour (in bursts of `burst`). Exactly one of the two."""

    every_s: float | None = None
    per_hour: float | None = None
    burst: int = 1

    def validate(self) -> tuple[str, str] | None:
        """(key, problem) or None."""
        if (self.every_s is None) == (self.per_hour is None):
            return "every_s", "give exactly one of every_s and per_hour"
        if self.every_s is not None and not (0 < self.every_s <= 86400):
            return "every_s", "must be in (0, 86400]"
        if self.per_hour is not None and not (0 < self.per_hour <= 3.6e6):
            return "per_hour", "must be in (0, 3600000]"
        if not 1 <= self.burst <= 10_000:
            return "burst", "must be in 1..10000"
        return None

    @property
    def period_s(self) -> float:
        """Seconds between the starts of two bursts, as requested."""
        if self.every_s is not None:
            return self.every_s
        assert self.per_hour is not None
        return 3600.0 * self.burst / self.per_hour


@dataclass(frozen=True)
class WakeCost:
    """The board's side of the trade (from its profile's [power] and [states])."""

    idle_w: float
    suspended_w: float
    transition_s: float  # suspend + resume
    transition_j: float
    camera_w: float = 0.0
    warmup_s: float = 0.0
    can_suspend: bool = True

    @classmethod
    def of(cls, device: DeviceProfile) -> WakeCost:
        """From a device profile; a profile without [states] never sleeps."""
        st = device.states
        if st is None or not st.can_suspend:
            return cls(device.power.idle_w, device.power.idle_w, 0.0, 0.0,
                       st.camera_w if st else 0.0, 0.0, can_suspend=False)
        return cls(device.power.idle_w, st.suspended_w, st.suspend_s + st.resume_s,
                   st.suspend_j + st.resume_j, st.camera_w, st.camera_warmup_s)


@dataclass(frozen=True)
class Plan:
    """What to do: one burst every `period_s`, awake in between or asleep for `sleep_s`."""

    mode: Literal["stay_up", "sleep"]
    period_s: float
    burst: int
    awake_s: float  # per period (the whole period when staying up)
    sleep_s: float  # per period (0 when staying up)
    average_w: float  # whole-board average over a period
    per_hour: float  # inferences an hour delivered
    requested_per_hour: float
    break_even_s: float  # a period longer than this is cheaper asleep (inf: never)
    over_budget: bool
    reason: str


def awake_s(cost: WakeCost, burst: int, infer_s: float, deliver_s: float) -> float:
    """Time awake per burst when sleeping between bursts."""
    return cost.transition_s + cost.warmup_s + burst * infer_s + deliver_s


def _sleep_fixed_j(cost: WakeCost, burst: int, infer_j: float, infer_s: float,
                   deliver_s: float) -> float:
    """Energy of one sleeping period above `suspended_w x period` (independent of T)."""
    return (cost.transition_j + (cost.idle_w + cost.camera_w) * (cost.warmup_s + burst * infer_s)
            + cost.idle_w * deliver_s + burst * infer_j
            - cost.suspended_w * awake_s(cost, burst, infer_s, deliver_s))


def average_w(mode: str, period_s: float, cost: WakeCost, burst: int, infer_j: float,
              infer_s: float, deliver_s: float) -> float:
    """Whole-board average power of one period in `mode` (math.inf when the period is too
    short for that mode: a sleep needs the awake time, a burst its inference time)."""
    if period_s < burst * infer_s:
        return math.inf
    if mode == "stay_up":
        return cost.idle_w + cost.camera_w + burst * infer_j / period_s
    if not cost.can_suspend or period_s < awake_s(cost, burst, infer_s, deliver_s):
        return math.inf
    return cost.suspended_w + _sleep_fixed_j(cost, burst, infer_j, infer_s, deliver_s) / period_s


def break_even_s(cost: WakeCost, burst: int, infer_j: float, infer_s: float,
                 deliver_s: float) -> float:
    """The period above which sleeping between bursts costs less than staying up."""
    saved_w = cost.idle_w + cost.camera_w - cost.suspended_w
    if not cost.can_suspend or saved_w <= 0:
        return math.inf
    fixed = _sleep_fixed_j(cost, burst, infer_j, infer_s, deliver_s) - burst * infer_j
    return max(fixed / saved_w, awake_s(cost, burst, infer_s, deliver_s))


def _min_period(mode: str, cost: WakeCost, burst: int, infer_j: float, infer_s: float,
                deliver_s: float, budget_w: float) -> float:
    """Shortest period `mode` can run within `budget_w` above the suspended floor."""
    floor = burst * infer_s
    if mode == "stay_up":
        spare = budget_w - (cost.idle_w + cost.camera_w - cost.suspended_w)
        if spare <= 0:
            return math.inf
        return max(floor, burst * infer_j / spare)
    if not cost.can_suspend:
        return math.inf
    need = _sleep_fixed_j(cost, burst, infer_j, infer_s, deliver_s)
    t = need / budget_w if budget_w > 0 else math.inf
    return max(t, awake_s(cost, burst, infer_s, deliver_s), floor)


def plan(schedule: Schedule, cost: WakeCost, infer_j: float, infer_s: float,
         budget_w: float = math.inf, deliver_s: float = 10.0,
         max_sleep_s: float = 3600.0) -> Plan:
    """The cheaper way to run `schedule` within `budget_w` (W above the suspended floor;
    math.inf: no energy constraint). See the module doc."""
    b = schedule.burst
    want = schedule.period_s
    requested = 3600.0 * b / want
    be = break_even_s(cost, b, infer_j, infer_s, deliver_s)
    best: tuple[float, float, str] | None = None  # (period, average, mode)
    for mode in ("stay_up", "sleep"):
        t = max(want, _min_period(mode, cost, b, infer_j, infer_s, deliver_s, budget_w))
        if not math.isfinite(t):
            continue
        p = average_w(mode, t, cost, b, infer_j, infer_s, deliver_s)
        if best is None or (t, p) < best[:2]:
            best = (t, p, mode)
    over = False
    if best is None:
        # Nothing fits the budget. A board that can sleep checks in every max_sleep_s (its
        # cheapest way to stay reachable); one that cannot stays up at the requested rate —
        # the energy budget's own rate cap then holds it down (power/energy.py).
        over = True
        if cost.can_suspend:
            t = max(max_sleep_s, awake_s(cost, b, infer_s, deliver_s))
            best = (t, average_w("sleep", t, cost, b, infer_j, infer_s, deliver_s), "sleep")
        else:
            best = (want, average_w("stay_up", want, cost, b, infer_j, infer_s, deliver_s),
                    "stay_up")
    period, avg, mode = best
    if mode == "sleep" and period > max_sleep_s and not over:
        period = max(max_sleep_s, awake_s(cost, b, infer_s, deliver_s))
        avg = average_w("sleep", period, cost, b, infer_j, infer_s, deliver_s)
        over = avg - cost.suspended_w > budget_w
    up = period if mode == "stay_up" else awake_s(cost, b, infer_s, deliver_s)
    delivered = 3600.0 * b / period
    why = (f"{mode.replace('_', ' ')}: {b} every {period:.0f} s ({delivered:.1f}/h of "
           f"{requested:.1f}/h requested), {avg:.3f} W average; break-even "
           + (f"{be:.0f} s" if math.isfinite(be) else "never (cannot suspend)")
           + (f"; budget {budget_w:.3f} W above the {cost.suspended_w:g} W floor"
              if math.isfinite(budget_w) else "")
           + ("; OVER BUDGET: the cheapest reachable schedule" if over else ""))
    return Plan(mode, period, b, up, period - up if mode == "sleep" else 0.0, avg, delivered,
                requested, be, over, why)  # type: ignore[arg-type]


def planning_forecast(est: energy_mod.EnergyState | None,
                      cfg: energy_mod.EnergyConfig) -> tuple[float, ...]:
    """The per-slot forecast the energy budget plans on (power/energy.py): the EWMA, and with
    `persistence` no more than yesterday's harvest of each seen slot; zero before any day."""
    if est is None:
        return (0.0,) * cfg.slots_per_day
    if not (cfg.persistence and est.yesterday_wh):
        return est.forecast_wh
    return tuple(min(f, y) if seen else f for f, y, seen in
                 zip(est.forecast_wh, est.yesterday_wh, est.seen, strict=True))


def affordable_w(battery_wh: float, t: float, forecast_wh: tuple[float, ...],
                 cfg: energy_mod.EnergyConfig, cost: WakeCost,
                 ahead: tuple[float, ...] | None = None) -> float:
    """Average power (W above the suspended floor) the energy planner allows now: its own
    horizon, forecast margin and reserve, with the suspended draw as the floor instead of the
    idle draw (a board that sleeps is not bound to the idle floor). `ahead`: the oracle's
    true harvest per slot (see power.energy.plan_power)."""
    ecfg = replace(cfg, idle_w=cost.suspended_w,
                   max_w=max(cfg.max_w if math.isfinite(cfg.max_w) else 0.0,
                             4 * (cost.idle_w + cost.camera_w)))
    return energy_mod.plan_power(battery_wh, t, forecast_wh, ecfg, ahead=ahead)
