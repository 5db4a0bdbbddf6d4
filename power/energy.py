"""Energy-neutral budget for battery/solar devices (after Kansal et al., ACM TECS 2007). Pure.

Harvest is forecast per time-of-day slot as an EWMA over past days, capped by yesterday's
harvest of the slot (weather persists: after a cloudy day, plan on another). Each slot the planner
picks the largest constant inference power P such that, over the next day, the battery
B_{k+1} = min(cap, B_k + eta [H_k - E_k]+ - [E_k - H_k]+),  E_k = (idle + P) * slot
never falls below the reserve, with the forecast discounted by a safety margin. The result is
a Decision like the thermal governor's; `governor.combine` takes the stricter of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from power.governor import Decision
from power.sensors import Reading

DAY = 86400.0


@dataclass(frozen=True)
class EnergyConfig:
    """The battery, the idle draw and how to plan."""

    capacity_wh: float
    idle_w: float
    max_w: float  # dynamic power of the top rung at full rate
    reserve_frac: float = 0.2
    charge_efficiency: float = 0.85
    slots_per_day: int = 24
    alpha: float = 0.5  # EWMA weight of the newest day
    forecast_margin: float = 0.2  # plan on 80% of the forecast harvest
    horizon_slots: int = 24
    neutral: bool = False  # also end the horizon no lower than it started (Kansal's condition;
    # measured: costs 3-4% of inferences and does not help the reserve, see docs/power.md)
    buffer_h: float = 1.5  # plan to keep this many hours of idle draw above the reserve
    persistence: bool = True  # forecast each slot as min(EWMA, yesterday): cloudy spells persist


@dataclass(frozen=True)
class EnergyState:
    """Forecast per slot (Wh) and the slot being accumulated."""

    forecast_wh: tuple[float, ...]
    seen: tuple[bool, ...]
    yesterday_wh: tuple[float, ...] = ()  # the last measured harvest of each slot
    slot_index: int | None = None  # absolute slot number (since t=0)
    slot_wh: float = 0.0
    last_t: float | None = None
    last_harvest_w: float = 0.0
    failsafe: bool = False


def initial_state(cfg: EnergyConfig) -> EnergyState:
    """No history: the forecast is zero until a day has been seen (conservative)."""
    return EnergyState((0.0,) * cfg.slots_per_day, (False,) * cfg.slots_per_day,
                       (0.0,) * cfg.slots_per_day)


def _slot_len(cfg: EnergyConfig) -> float:
    return DAY / cfg.slots_per_day


def plan_power(battery_wh: float, t: float, forecast_wh: tuple[float, ...],
               cfg: EnergyConfig, ahead: tuple[float, ...] | None = None) -> float:
    """Largest constant dynamic power (W) that keeps the battery above reserve over the horizon.

    `forecast_wh` is per slot of the day (cyclic); `ahead`, when given, is the harvest of each
    of the next `horizon_slots` slots instead (the oracle, which knows the weather)."""
    # The floor the plan keeps: the reserve plus `buffer_h` of idle draw. Forecasts come from past
    # days, so the first day of a cloudy spell is always over-forecast; the buffer is what
    # carries the device through it without touching the reserve.
    reserve = min(cfg.reserve_frac * cfg.capacity_wh + cfg.idle_w * cfg.buffer_h,
                  0.9 * cfg.capacity_wh)
    if battery_wh <= reserve:
        return 0.0
    slot_s = _slot_len(cfg)
    first = int(t // slot_s)
    frac_left = 1 - (t % slot_s) / slot_s

    def ok(p: float) -> bool:
        b = battery_wh
        for k in range(cfg.horizon_slots):
            share = frac_left if k == 0 else 1.0
            slot_wh = ahead[k] if ahead is not None else forecast_wh[
                (first + k) % cfg.slots_per_day]
            harvest = slot_wh * share * (1 - cfg.forecast_margin)
            use = (cfg.idle_w + p) * slot_s / 3600 * share
            net = harvest - use
            b = min(cfg.capacity_wh, b + (cfg.charge_efficiency * net if net > 0 else net))
            if b < reserve:
                return False
        # Energy neutrality: a day that only just clears the reserve leaves nothing for a
        # cloudy spell the one-day forecast cannot see.
        return not cfg.neutral or b >= min(battery_wh, 0.95 * cfg.capacity_wh)

    if ok(cfg.max_w):
        return cfg.max_w
    if not ok(0.0):
        return 0.0
    lo, hi = 0.0, cfg.max_w
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def step(state: EnergyState, r: Reading, cfg: EnergyConfig) -> tuple[EnergyState, Decision]:
    """Account the harvest since the last tick, update the forecast at slot ends, re-plan."""
    slot_s = _slot_len(cfg)
    harvest = r.harvest_w if r.harvest_w is not None else 0.0
    s = state
    if s.last_t is not None and r.t > s.last_t:
        s = replace(s, slot_wh=s.slot_wh + (harvest + s.last_harvest_w) / 2
                    * (r.t - s.last_t) / 3600)
    index = int(r.t // slot_s)
    if s.slot_index is None:
        s = replace(s, slot_index=index)
    elif index != s.slot_index:
        k = s.slot_index % cfg.slots_per_day
        old = s.forecast_wh[k]
        new = s.slot_wh if not s.seen[k] else cfg.alpha * s.slot_wh + (1 - cfg.alpha) * old
        y = s.yesterday_wh or (0.0,) * cfg.slots_per_day
        s = replace(s, forecast_wh=(*s.forecast_wh[:k], new, *s.forecast_wh[k + 1:]),
                    seen=(*s.seen[:k], True, *s.seen[k + 1:]), slot_index=index, slot_wh=0.0,
                    yesterday_wh=(*y[:k], s.slot_wh, *y[k + 1:]))
    s = replace(s, last_t=r.t, last_harvest_w=harvest)
    battery_wh = r.battery_wh if r.battery_wh is not None else (
        None if r.battery_frac is None else r.battery_frac * cfg.capacity_wh)
    if battery_wh is None:
        events = () if s.failsafe else (
            f"battery sensor invalid ({'; '.join(r.problems) or 'no reading'}): treating the "
            "battery as low, inference paused until it reads again",)
        return replace(s, failsafe=True), Decision(0.0, reason="fail-safe: no battery reading",
                                                   events=events)
    events = ("battery sensor reads again: energy budget resumes",) if s.failsafe else ()
    s = replace(s, failsafe=False)
    forecast = s.forecast_wh
    if cfg.persistence and s.yesterday_wh:
        # Weather persists: after a cloudy day, plan on another one (the EWMA alone would
        # still expect most of the sunny days before it).
        forecast = tuple(min(f, y) if seen else f for f, y, seen in
                         zip(s.forecast_wh, s.yesterday_wh, s.seen, strict=True))
    p = plan_power(battery_wh, r.t, forecast, cfg)
    reserve = cfg.reserve_frac * cfg.capacity_wh
    why = (f"battery {battery_wh:.1f} Wh (reserve {reserve:.1f}); plan {p:.2f} W keeps it above "
           f"reserve for {cfg.horizon_slots} slots")
    return s, Decision(p if p < cfg.max_w else math.inf, reason=why, events=events)
