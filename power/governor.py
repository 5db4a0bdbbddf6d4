"""Pure thermal policies: `step(state, trend, cfg) -> (state, decision)`.

A decision is a power budget in box watts (what the whole box may draw: its idle floor
`floor_w` plus the dynamic power of inference and the stages around it) and an optional rate
cap; `power.rungs.select_for_budget` turns it into the most accurate ladder rung whose box
power fits. With `floor_w` = 0 the figures are dynamic power alone (the old meaning: a
config built by hand without a floor behaves exactly as before). Like the kernel's
governors, the policies are tiny and the core (`power.control`) owns sensing, trend and
every timer: a policy sees a filtered temperature and its slope and says which way to go,
with the gate the core paces the move by (`Decision.gate`: at once, after the settle time,
after the release dwell with its back-off); as Linux's step_wise keeps no timer and the
thermal core polls it. Two policies, both predictive (they act on the trend before a trip is
reached):

- step_wise (after drivers/thermal/gov_step_wise.c and thermald): a level up at once while
  rising past the trip or predicted to reach it within `horizon_s`; a level up gated by the
  core's settle time while above the trip and not falling, or rising (a measured slope > 0)
  within `band_c` under it; held while hot and falling; a level down gated by the core's
  release dwell once below trip - hysteresis. The band catches a creep the horizon misses:
  after a small step the trend is blind for a few readings, then fitted across the bend and
  shrunk, so the die can creep onto the trip. A slope of 0 in the band (no trend yet, or one
  too small to see) holds: the die is under its trip. The band costs output only where the
  die rides the trip for hours (docs/power.md has the measured trade).
- power_allocator (after drivers/thermal/gov_power_allocator.c, IPA): PID on
  e = T_control - T over the headroom above the floor, H = S - floor:
  budget = floor + clamp(H + p + i, 0, max - floor), with the kernel's default gains
  k_po = H/(T_control - T_on), k_pu = 2H/(T_control - T_on), k_i = k_pu/10, k_d = 0 (the
  kernel's S is the power it can allocate: the floor is drawn whatever the governor does).
  Below T_on the PID resets and the load gets full power.

No valid temperature (the core already held the last one as long as it may) fails safe: the
device is treated as hot (lowest level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class GovernorConfig:
    """Thresholds in °C, powers in box watts (the idle floor `floor_w` included)."""

    control_c: float  # the passive trip: the temperature edgerun holds the die below
    critical_c: float
    sustainable_w: float  # box power the device dissipates at control_c (IPA's S + floor)
    max_w: float  # box power with the top rung at full rate
    levels_w: tuple[float, ...]  # step_wise: budget per level; levels_w[0] = inf (no limit)
    policy: Literal["step_wise", "power_allocator"] = "step_wise"
    hyst_c: float = 3.0
    switch_on_c: float | None = None  # IPA's T_on; default control_c - 10
    horizon_s: float = 20.0  # predictive: act when the trend reaches the trip within this
    critical_margin_c: float = 3.0  # go to the bottom this close to the critical trip
    band_c: float = 0.3  # step_wise's band under the trip (module doc; [governor] band_c)
    floor_w: float = 0.0  # the box's idle floor: drawn whatever runs (0: dynamic watts)


@dataclass(frozen=True)
class GovernorState:
    """What a governor remembers between ticks (no timer: the core keeps those)."""

    level: int = 0  # the level in force (the core sets it once it has paced a move)
    last_t: float | None = None
    integral: float = 0.0
    failsafe: bool = False


# How the core paces a move to `Decision.level` (power.control owns the timers):
# "now": at once (the critical margin, fail-safe, power_allocator's budget);
# "up": at once, and a climb right after a release backs the release dwell off;
# "settle": a level up once the settle time has passed since the last change (backs off too);
# "dwell": a level down once the release dwell has passed since the last change.
Gate = Literal["now", "up", "settle", "dwell"]


@dataclass(frozen=True)
class Decision:
    """Power budget and rate cap for the inference load, with the reason and any events."""

    budget_w: float  # box watts; math.inf = unrestricted
    rate_cap_hz: float = math.inf
    level: int = 0  # the level the policy asks for (in force once the core's gate opens)
    reason: str = ""
    events: tuple[str, ...] = ()
    gate: Gate = "now"


@dataclass(frozen=True)
class Trend:
    """What the control core hands a policy: the filtered temperature and its slope."""

    t: float  # device time, s
    temp_c: float | None  # None: no valid reading (fail safe)
    slope: float = 0.0  # °C/s
    problem: str = ""  # why temp_c is None


def _failsafe(state: GovernorState, tr: Trend, cfg: GovernorConfig) -> tuple[GovernorState,
                                                                               Decision]:
    bottom = len(cfg.levels_w) - 1
    events = () if state.failsafe else (
        f"thermal sensor invalid ({tr.problem or 'no temperature'}): treating the "
        "device as hot, inference held at the lowest power until it reads again",)
    s = replace(state, failsafe=True, integral=0.0, last_t=tr.t)
    return s, Decision(cfg.levels_w[bottom], level=bottom, reason="fail-safe: no valid "
                       "temperature", events=events)


def step(state: GovernorState, tr: Trend, cfg: GovernorConfig) -> tuple[GovernorState,
                                                                       Decision]:
    """One governor tick: the level (or budget) asked for and the gate the core paces it by;
    `state.level` is left to the core, which knows when the move is taken."""
    if tr.temp_c is None:
        return _failsafe(state, tr, cfg)
    events: tuple[str, ...] = ()
    if state.failsafe:
        events = (f"thermal sensor reads again ({tr.temp_c:.1f} °C): governor resumes",)
        state = replace(state, failsafe=False)
    dt = 0.0 if state.last_t is None else max(0.0, tr.t - state.last_t)
    state = replace(state, last_t=tr.t)
    if cfg.policy == "step_wise":
        s, d = state, _step_wise(state.level, tr.temp_c, tr.slope, cfg)
    else:
        s, d = _power_allocator(state, tr.temp_c, tr.slope, dt, cfg)
    return s, replace(d, events=events + d.events)


def _step_wise(level: int, temp: float, slope: float, cfg: GovernorConfig) -> Decision:
    """Which way from `level`, and the core's gate for it (module doc)."""
    bottom = len(cfg.levels_w) - 1
    predicted = temp + max(slope, 0.0) * cfg.horizon_s
    band = cfg.control_c - min(cfg.band_c, cfg.hyst_c / 2)  # never into the release zone
    want, gate, why = level, "now", "holding"
    rising = (temp >= cfg.control_c or predicted >= cfg.control_c) and slope > 0
    # not falling: above the trip a slope of 0 counts (unknown, or too small to see); in the
    # band under it only a rise the trend has measured does
    creeping = slope >= 0 if temp >= cfg.control_c else temp >= band and slope > 0
    if temp >= cfg.critical_c - cfg.critical_margin_c:
        want, why = bottom, f"{temp:.1f} °C is within {cfg.critical_margin_c:g} °C of critical"
    elif rising or creeping:
        want, gate = min(level + 1, bottom), "up" if rising else "settle"
        why = (f"{temp:.1f} °C {'rising' if slope > 0 else 'not falling'} "
               f"{slope * 60:+.1f} °C/min, trip {cfg.control_c:g} °C "
               + ("crossed" if temp >= cfg.control_c else
                  f"due in {(cfg.control_c - temp) / slope:.0f} s" if slope > 0 else
                  f"{cfg.control_c - temp:.1f} °C away"))
    elif temp < cfg.control_c - cfg.hyst_c and level > 0:
        want, gate = level - 1, "dwell"
        why = f"{temp:.1f} °C below {cfg.control_c - cfg.hyst_c:g} °C"
    return Decision(cfg.levels_w[want], level=want, reason=why, gate=gate)


def _level_of(budget: float, cfg: GovernorConfig) -> int:
    """The step_wise-equivalent level of a budget, for reporting."""
    return next((i for i, w in enumerate(cfg.levels_w) if w <= budget + 1e-9),
                len(cfg.levels_w) - 1)


def _power_allocator(s: GovernorState, temp: float, slope: float, dt: float,
                     cfg: GovernorConfig) -> tuple[GovernorState, Decision]:
    t_on = cfg.switch_on_c if cfg.switch_on_c is not None else cfg.control_c - 10.0
    predicted = temp + slope * cfg.horizon_s
    floor = cfg.floor_w
    if temp >= cfg.critical_c - cfg.critical_margin_c:
        s = replace(s, integral=0.0)
        budget, why = floor, f"{temp:.1f} °C is within {cfg.critical_margin_c:g} °C of critical"
    elif temp < t_on and predicted < t_on:
        s = replace(s, integral=0.0)
        budget, why = math.inf, f"{temp:.1f} °C below switch-on {t_on:g} °C: full power"
    else:
        S = cfg.sustainable_w - floor  # the headroom the policy can allocate
        top = cfg.max_w - floor
        span = max(cfg.control_c - t_on, 1e-6)
        k_po, k_pu = S / span, 2 * S / span
        k_i = k_pu / 10
        e = cfg.control_c - predicted
        p = (k_po if e < 0 else k_pu) * e
        integral = min(max(s.integral + k_i * e * dt, -top), top)
        budget = floor + max(S + p + integral, 0.0)
        budget = math.inf if budget >= cfg.max_w else budget  # the top rung fits: no limit
        s = replace(s, integral=integral)
        why = (f"PID: predicted {predicted:.1f} °C vs control {cfg.control_c:g} °C -> "
               f"{budget:.2f} W")
    return s, Decision(budget, level=_level_of(budget, cfg), reason=why)


def combine(*decisions: Decision) -> Decision:
    """Thermal and energy decisions together: the stricter budget and rate win (every
    budget in box watts, the same floor)."""
    budget = min(d.budget_w for d in decisions)
    rate = min(d.rate_cap_hz for d in decisions)
    strict = min(decisions, key=lambda d: (d.budget_w, d.rate_cap_hz))
    return Decision(budget, rate, max(d.level for d in decisions), strict.reason,
                    tuple(e for d in decisions for e in d.events))
