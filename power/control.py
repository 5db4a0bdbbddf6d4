"""The one control step: sensing hygiene, trend, thermal policy, energy budget, ladder -> rung
and rate cap. Pure; `edgerun serve` calls it every tick, the simulator harness every simulated
step, the benches through the harness. Nothing else decides a rung.

    step(state, reading, rungs, cfg, current, operator_rate_hz) -> (state', Output)

What the core owns (so the policies in power/governor.py and power/energy.py stay tiny):
- **Timers**: every hold, dwell and back-off (power/timers.py): a policy says which way and
  the gate (at once, after `settle_s`, after the release dwell); the core paces it. The rung
  hold and the level's release dwell share `dwell_s`/`max_dwell_s`.
- **Holding**: an invalid reading (a missing file, garbage, out of range) is replaced by the
  last valid value for `hold_invalid_s` of device time; only after that does the thermal policy
  fail safe (device treated as hot) or the energy budget pause. One dropped read of a noisy
  sysfs file must not send the device to its bottom rung.
- **Temperature**: the median of the last `median_of` valid readings (robust to noise and to a
  wild reading, a two-second lag at 1 Hz that the predictive horizon covers).
- **Trend**: the slope comes from a least-squares line over the last
  `trend_window_s` of valid readings, refitted once without outliers (residuals beyond
  3 x 1.4826 x MAD) and shrunk by two standard errors towards 0. Two-point differences
  amplify noise; the fit does not.
  The window restarts when the actuation (rung or rate cap) changes: readings from before a
  step down describe a load that is gone, and a fit across the step would report "still
  rising" for half a window and escalate again and again. Until `settle_samples` readings of
  the new regime exist the slope is taken as 0: the policies hold instead of guessing.
- **Budget -> rung**: the most accurate rung whose power fits (`runtime.choice.ladders`), with the
  rung hold against flapping; the step_wise levels are recomputed from the rungs every step,
  so rungs whose energy is kept current by the running pipeline move the levels with them.
- **Upgrade guard**: a step up (a richer rung or a higher rate cap) is taken only if the extra
  power through the die-to-ambient resistance (`r_total_k_per_w`, the profile's thermal model)
  would settle `guard_margin_c` under the control trip (where nothing escalates again); when
  the step is too big, the smaller one (the same rung at a higher rate) is tried. Without it a
  big gap between rungs is a limit cycle: release at 69 °C, rise at 35 °C/min, step down four
  seconds later, forever.
- **Minimum duty**: a budget the cheapest rung cannot meet caps the rate at what it allows,
  but never below `min_rate_hz`. 0 W means minimum duty, never "uncapped".
- **Physics-bounded**: at minimum duty with the die still above the control temperature for
  `bounded_after_s`, the device cannot be held below its trip by anything edgerun does (idle
  power alone passes it at this ambient): one critical event says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from power import die_estimate as die_est
from power import energy as energy_mod
from power import governor as gov
from power.device import DeviceProfile, ThermalModel
from power.rungs import RATE_STEPS, Rung, budget_levels, select_for_budget
from power.sensors import Reading
from power.timers import LevelTimers, RungHold, hold, pace


@dataclass(frozen=True)
class ControlConfig:
    """Everything the step needs besides its inputs."""

    governor: gov.GovernorConfig | None  # None: no thermal control (policy off)
    energy: energy_mod.EnergyConfig | None = None  # battery devices
    rate_hz: float = 10.0  # the rate frames are offered at; rung powers are computed at it
    min_rate_hz: float = 0.2  # minimum duty under a budget no rung fits (0 = pause)
    hold_invalid_s: float = 30.0  # an invalid reading holds the last valid one this long
    trend_window_s: float = 30.0
    settle_samples: int = 5
    median_of: int = 5  # the temperature acted on: median of the last this-many valid readings
    # The core's timers (power/timers.py): a level up on a creep waits settle_s since the
    # last change; a rung upgrade and a level release wait dwell_s, doubled against limit
    # cycles up to max_dwell_s
    settle_s: float = 10.0
    dwell_s: float = 60.0
    max_dwell_s: float = 900.0
    bounded_after_s: float = 300.0
    r_total_k_per_w: float | None = None  # die to ambient; None: no upgrade guard
    guard_margin_c: float = 1.0  # an upgrade must settle this far under the control trip
    # Excursions (module doc): the die's share of r_total and the case's time constant;
    # None: the guard admits steady-state upgrades only
    r_die_case_k_per_w: float = 0.0
    case_tau_s: float | None = None
    excursion_s: float = 400.0  # an excursion must keep the die under the guard this long
    # The die estimate (power/die_estimate.py) needs the die's own time constant too; None
    # (or estimator None): the median of the last readings is acted on instead
    die_tau_s: float | None = None
    estimator: die_est.EstimatorConfig | None = field(default_factory=die_est.EstimatorConfig)
    # the box's idle floor: budgets are box watts, this + the rungs' dynamic power (None:
    # the governor's floor_w, 0 without a governor)
    floor_w: float | None = None
    # False while a duty cycle spends the battery (docs/sleep.md, power/control_settings.py):
    # the energy budget still learns its forecast and plans (the sleep plan reads both),
    # but picks no rung and caps no rate, save its fail-safe (no battery reading)
    energy_binds: bool = True


@dataclass(frozen=True)
class Held:
    """The last valid value of one sensor and when it was read (device time)."""

    value: float | None = None
    t: float = -math.inf


@dataclass(frozen=True)
class ControlState:
    """What the step remembers between ticks."""

    governor: gov.GovernorState = field(default_factory=gov.GovernorState)
    level_timers: LevelTimers = field(default_factory=LevelTimers)
    energy: energy_mod.EnergyState | None = None
    hold: RungHold = field(default_factory=RungHold)
    samples: tuple[tuple[float, float], ...] = ()  # (t, °C) valid readings in the window
    recent: tuple[float, ...] = ()  # the last valid readings (for the median)
    actuation: tuple[int, float] | None = None  # (rung, rate cap) of the last output
    temp: Held = field(default_factory=Held)
    battery_wh: Held = field(default_factory=Held)
    battery_frac: Held = field(default_factory=Held)
    holding: bool = False  # an invalid reading is being bridged now
    hold_said_t: float = -math.inf  # when the last sensor_hold event was raised
    bottom_since: float | None = None  # at minimum duty and above control since
    bounded: bool = False
    # on an excursion (module doc): the (rung, rate cap) it came from and when it began
    excursion: tuple[int, float, float] | None = None
    die: die_est.DieEstimate = field(default_factory=die_est.DieEstimate)


# The event types the control step emits: members of runtime/wire/events.py `EventType`,
# named here because power/ imports nothing of runtime/ (tests/wire/test_events.py checks both).
ControlEventType = Literal["governor", "energy", "sensor_hold", "physics_bounded",
                           "physics_bounded_cleared"]


@dataclass(frozen=True)
class ControlEvent:
    """Something the operator should see (the daemon logs it and queues it as an event)."""

    type: ControlEventType
    severity: str  # info | warning | critical
    detail: str


@dataclass(frozen=True)
class Output:
    """What to run now."""

    rung: int
    rate_cap_hz: float  # math.inf = no cap; otherwise >= min_rate_hz unless the operator's
    budget_w: float
    level: int
    reason: str
    temp_c: float | None  # filtered
    slope_c_per_min: float
    events: tuple[ControlEvent, ...] = ()
    refused: str = ""  # why a richer rung or rate the budget allows is not taken now ("": none)


def governor_config(device: DeviceProfile, policy: str, control_c: float | None = None,
                    critical_c: float | None = None, hyst_c: float | None = None,
                    design_ambient_c: float = 25.0,
                    band_c: float = gov.GovernorConfig.band_c) -> gov.GovernorConfig:
    """Thermal policy settings from the device profile; trips found on the device (sysfs)
    override the profile's. Powers in box watts: the floor is the profile's idle power, the
    sustainable power what the die-to-ambient resistance lets the box dissipate at the trip
    (the headroom above the floor at least 0.1 W). `levels_w`/`max_w` are filled in by
    `step` from the live rungs."""
    th = device.thermal
    assert th is not None
    m = th.model
    control = control_c if control_c is not None else th.trip("passive").temp_c
    floor = device.power.idle_w
    sustainable = floor + max(0.1, (control - design_ambient_c) / (m.r_die_case + m.r_case_amb)
                              - floor)
    return gov.GovernorConfig(
        control_c=control,
        critical_c=critical_c if critical_c is not None else th.trip("critical").temp_c,
        sustainable_w=sustainable, max_w=math.inf, levels_w=(math.inf,), floor_w=floor,
        policy=policy,  # type: ignore[arg-type]
        hyst_c=hyst_c if hyst_c is not None else th.trip("passive").hyst_c, band_c=band_c)


def robust_trend(samples: Sequence[tuple[float, float]], t: float) -> tuple[float, float]:
    """(temperature at t, slope °C/s): least squares over `samples`, refitted once without
    outliers. The slope is shrunk by two standard errors towards 0 (a trend the noise could
    have made is no trend: acting on it escalates on noise). Two samples: their difference;
    one: no slope. Plain Python: a window holds tens of samples, where numpy's per-call cost
    dominates (this runs every tick, and millions of times in the benches)."""
    if len(samples) == 2:
        (t0, y0), (t1, y1) = samples
        return y1, (y1 - y0) / (t1 - t0) if t1 > t0 else 0.0
    if len(samples) < 3:
        return samples[-1][1], 0.0
    pts = [(x - t, y) for x, y in samples]
    a, b = _line(pts)
    res = [y - (a + b * x) for x, y in pts]
    med = statistics.median(res)
    mad = statistics.median(abs(r - med) for r in res)
    limit = max(3 * 1.4826 * mad, 0.05)
    kept = [p for p, r in zip(pts, res, strict=True) if abs(r) <= limit]
    if 3 <= len(kept) < len(pts):
        pts = kept
        a, b = _line(pts)
    n = len(pts)
    xm = sum(x for x, _ in pts) / n
    sxx = sum((x - xm) ** 2 for x, _ in pts)
    sse = sum((y - (a + b * x)) ** 2 for x, y in pts)
    se = math.sqrt(sse / (n - 2) / sxx) if sxx > 0 else 0.0
    return a, math.copysign(max(abs(b) - 2 * se, 0.0), b)


def _line(pts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(pts)
    xm = sum(x for x, _ in pts) / n
    ym = sum(y for _, y in pts) / n
    sxx = sum((x - xm) ** 2 for x, _ in pts)
    b = sum((x - xm) * (y - ym) for x, y in pts) / sxx if sxx > 0 else 0.0
    return ym - b * xm, b


def _held(h: Held, value: float | None, t: float, hold_s: float) -> tuple[Held, float | None]:
    if value is not None:
        return Held(value, t), value
    return h, (h.value if t - h.t <= hold_s else None)


@dataclass(frozen=True)
class _Sensed:
    """What one tick's sensing hands the policies."""

    temp_c: float | None  # the median acted on; None once the hold has run out
    slope: float  # °C/s, 0 until the regime has settled
    problem: str  # the reading's problems, "; "-joined
    battery_wh: float | None  # held
    battery_frac: float | None  # held


def _die_model(cfg: ControlConfig) -> die_est.DieModel | None:
    """The die estimate's model from the config's thermal figures (None: not all known)."""
    if cfg.r_total_k_per_w is None or cfg.case_tau_s is None or cfg.die_tau_s is None:
        return None
    return die_est.DieModel(cfg.r_die_case_k_per_w, cfg.die_tau_s,
                            cfg.r_total_k_per_w - cfg.r_die_case_k_per_w, cfg.case_tau_s)


def ran_w(state: ControlState, rungs: Sequence[Rung], cfg: ControlConfig,
          current: int | None) -> float:
    """The box watts drawn since the last tick: the floor and the rung running (`current`,
    else the last output's) at the last output's rate cap; the floor alone before any."""
    floor = _floor(cfg)
    if state.actuation is None or not rungs:
        return floor
    rung, cap = state.actuation
    rung = min(current if current is not None else rung, len(rungs) - 1)
    return floor + rungs[rung].power_w(min(cfg.rate_hz, cap))


def _sense(state: ControlState, r: Reading, cfg: ControlConfig, power_w: float,
           events: list[ControlEvent]) -> tuple[ControlState, _Sensed]:
    """Sensing hygiene: hold the last valid values for a bounded time, the trend window, the
    temperature acted on (module doc: Holding, Temperature, Trend); `power_w` is what the box
    drew since the last tick (the die estimate's input)."""
    t = r.t
    temp_h, temp = _held(state.temp, r.temp_c, t, cfg.hold_invalid_s)
    bwh_h, bwh = _held(state.battery_wh, r.battery_wh, t, cfg.hold_invalid_s)
    bfr_h, bfr = _held(state.battery_frac, r.battery_frac, t, cfg.hold_invalid_s)
    problem = "; ".join(r.problems)
    holding = bool(r.problems) and (
        (r.temp_c is None and temp is not None)
        or (r.battery_wh is None and r.battery_frac is None and (bwh or bfr) is not None))
    said = state.hold_said_t
    if holding and not state.holding and t - said >= 60.0:  # a flaky sensor: once a minute
        said = t
        events.append(ControlEvent("sensor_hold", "warning", (
            f"invalid reading ({problem}): holding the last valid value for up to "
            f"{cfg.hold_invalid_s:g} s before failing safe")))
    samples = state.samples
    if r.temp_c is not None:
        samples = (*samples, (t, r.temp_c))
    # device time may jump (NTP at boot on boards without an RTC): keep only the window
    samples = tuple(s for s in samples if 0 <= t - s[0] <= cfg.trend_window_s)
    recent = state.recent
    if r.temp_c is not None:
        recent = (*recent, r.temp_c)[-cfg.median_of:]
    slope = robust_trend(samples, t)[1] if len(samples) >= cfg.settle_samples else 0.0
    # The temperature acted on: the die estimate (power/die_estimate.py: the model's
    # prediction from the power it ran, fused with the readings) where the device's thermal
    # model is known, else the median of the last few valid readings, across trend restarts
    # (right after a restart the fit has two points, and the last raw reading of a noisy
    # sensor would trip the governor on noise). None once the hold has run out.
    die = state.die
    model = _die_model(cfg)
    if model is not None and cfg.estimator is not None:
        die = die_est.update(die, t, power_w, r.temp_c, model, cfg.estimator)
    if temp is None or not recent:
        temp_now = None
    elif die.temp_c is not None:
        temp_now = die.temp_c
    else:
        temp_now = statistics.median(recent)
    s = replace(state, temp=temp_h, battery_wh=bwh_h, battery_frac=bfr_h, samples=samples,
                holding=holding, recent=recent, hold_said_t=said, die=die)
    return s, _Sensed(temp_now, slope, problem, bwh, bfr)


def _floor(cfg: ControlConfig) -> float:
    """The box's idle floor in W: budgets are box watts, this plus the rungs' dynamic power
    (`floor_w`, else the governor's, 0 without a governor)."""
    if cfg.floor_w is not None:
        return cfg.floor_w
    return cfg.governor.floor_w if cfg.governor is not None else 0.0


def thermal_step(g: gov.GovernorState, timers: LevelTimers, tr: gov.Trend,
                 gcfg: gov.GovernorConfig, cfg: ControlConfig
                 ) -> tuple[gov.GovernorState, LevelTimers, gov.Decision]:
    """The thermal policy paced by the core's timers (power/timers.py): the policy asks for a
    level and a gate, the core decides when it is taken and says so (a `level a -> b` event,
    not while failing safe: that has its own)."""
    g2, asked = gov.step(g, tr, gcfg)
    timers, level, why = pace(timers, g.level, asked, tr.t, cfg.settle_s, cfg.dwell_s,
                              cfg.max_dwell_s)
    budget = asked.budget_w if level == asked.level else gcfg.levels_w[level]
    events = asked.events
    if level != g.level and not g2.failsafe:
        events += (f"level {g.level} -> {level} (budget {budget:.3g} W): {why}",)
    return (replace(g2, level=level), timers,
            replace(asked, budget_w=budget, level=level, reason=why, events=events))


def _policies(s: ControlState, r: Reading, seen: _Sensed, rungs: Sequence[Rung],
              cfg: ControlConfig, extra: gov.Decision | None,
              events: list[ControlEvent]) -> tuple[ControlState, gov.Decision]:
    """The thermal policy, the energy budget and `extra`, combined: the stricter wins."""
    rate = cfg.rate_hz
    floor = _floor(cfg)
    decision = gov.Decision(math.inf, reason="")
    if cfg.governor is not None:
        gcfg = replace(cfg.governor, levels_w=budget_levels(rungs, rate, cfg.min_rate_hz, floor),
                       max_w=rungs[-1].box_w(rate, floor), floor_w=floor)
        g, timers, decision = thermal_step(s.governor, s.level_timers, gov.Trend(
            r.t, seen.temp_c, seen.slope, seen.problem), gcfg, cfg)
        s = replace(s, governor=g, level_timers=timers)
        events += [ControlEvent("governor", "warning", e) for e in decision.events]
    if cfg.energy is not None:
        ecfg = replace(cfg.energy, max_w=rungs[-1].power_w(rate))
        est = s.energy if s.energy is not None else energy_mod.initial_state(ecfg)
        est, edec = energy_mod.step(est, replace(r, battery_wh=seen.battery_wh,
                                                 battery_frac=seen.battery_frac), ecfg)
        s = replace(s, energy=est)
        events += [ControlEvent("energy", "warning", e) for e in edec.events]
        if math.isfinite(edec.budget_w):  # its budget is dynamic power: in box watts here
            edec = replace(edec, budget_w=edec.budget_w + floor)
        # Duty cycling: the sleep plan spends the battery; a budget planned over the awake
        # idle floor would only step down a rung whose burst costs nothing next to a wake,
        # and its rate cap would stretch the burst, keeping the box awake longer. The
        # fail-safe binds still: nobody knows the battery then (its event says paused).
        if cfg.energy_binds or est.failsafe:
            decision = gov.combine(decision, edec)
    if extra is not None:  # a dynamic-watts budget (a bench's baseline): in box watts here
        if math.isfinite(extra.budget_w):
            extra = replace(extra, budget_w=extra.budget_w + floor)
        decision = gov.combine(decision, extra)
    return s, decision


@dataclass(frozen=True)
class _Actuation:
    """A proposed rung and rate cap, with the rung hold and the reason that go with them."""

    rung: int
    cap: float
    hold: RungHold
    reason: str
    excursion: bool = False  # a step up its steady state would not allow (module doc)


def _budget_to_rung(s: ControlState, rungs: Sequence[Rung], cfg: ControlConfig,
                    decision: gov.Decision, current: int | None, t: float
                    ) -> tuple[int, _Actuation, int]:
    """(the rung running now, what the budget asks for, the rung the budget alone would
    pick): the most accurate rung that fits, held against flapping, and the rate cap
    (module doc: Budget -> rung, Minimum duty)."""
    rate = cfg.rate_hz
    now = current if current is not None else (s.hold.rung if s.hold.rung is not None
                                                else len(rungs) - 1)
    now = min(now, len(rungs) - 1)
    proposed, fit_rate = select_for_budget(rungs, decision.budget_w, rate, now,
                                           floor_w=_floor(cfg))
    h = hold(replace(s.hold, rung=now), proposed, t, cfg.dwell_s, cfg.max_dwell_s)
    new_rung = h.rung if h.rung is not None else now
    cap = _capped(min(decision.rate_cap_hz, fit_rate if fit_rate < rate else math.inf), cfg)
    return now, _Actuation(new_rung, cap, h, decision.reason), proposed


def guard_settings(model: ThermalModel | None) -> dict[str, float | None]:
    """The upgrade guard's thermal figures from a device's two-node model (ControlConfig's
    r_total_k_per_w, r_die_case_k_per_w, case_tau_s, die_tau_s; the die estimate uses them
    too): None without a model."""
    if model is None:
        return {"r_total_k_per_w": None}
    return {"r_total_k_per_w": model.r_die_case + model.r_case_amb,
            "r_die_case_k_per_w": model.r_die_case,
            "case_tau_s": model.r_case_amb * model.c_case,
            "die_tau_s": model.r_die_case * model.c_die}


def time_under(temp_c: float, extra_w: float, limit_c: float, r_die_case: float,
               r_total: float, case_tau_s: float) -> float:
    """Seconds the die stays under `limit_c` after drawing `extra_w` more, from `temp_c` at
    steady state: it jumps by extra x r_die_case at once (its own time constant is
    seconds), then the case creeps towards the rest of extra x r_total with `case_tau_s`."""
    jump = temp_c + extra_w * r_die_case
    if jump >= limit_c:
        return 0.0
    creep = extra_w * (r_total - r_die_case)
    if creep <= 0 or limit_c - jump >= creep:
        return math.inf
    return -case_tau_s * math.log(1 - (limit_c - jump) / creep)


def _capped(cap: float, cfg: ControlConfig) -> float:
    """Minimum duty: a finite cap is never below `min_rate_hz` ("uncapped" only as inf)."""
    return max(cap, cfg.min_rate_hz) if math.isfinite(cap) else cap


def _cap_for(rung: Rung, decision: gov.Decision, cfg: ControlConfig) -> float:
    """The rate cap a budget sets for one rung (inf: none), never below minimum duty."""
    fit = rung.rate_for(decision.budget_w, _floor(cfg))
    return _capped(min(decision.rate_cap_hz, fit if fit < cfg.rate_hz else math.inf), cfg)


def _excursion(s: ControlState, rungs: Sequence[Rung], cfg: ControlConfig,
               decision: gov.Decision, temp_now: float, slope: float, proposed: int, t: float
               ) -> _Actuation | None:
    """An excursion (module doc): from the rung running now to the richer rung the budget
    allows that buys the most accuracy-weighted inferences per extra watt, among those that
    keep the die under the guard for at least `excursion_s`; None when none does."""
    g, tau = cfg.governor, cfg.case_tau_s
    if (g is None or tau is None or cfg.r_total_k_per_w is None or s.actuation is None
            or s.holding or slope > 0):
        return None  # time_under starts from a die at rest, read now
    rate, limit = cfg.rate_hz, g.control_c - cfg.guard_margin_c
    old_rung, old_cap = s.actuation
    old_rung = min(old_rung, len(rungs) - 1)

    def served(r: Rung, cap: float) -> float:
        return r.accuracy * min(rate, cap, r.max_rate_hz())

    base_w, base_g = rungs[old_rung].power_w(min(rate, old_cap)), served(rungs[old_rung],
                                                                          old_cap)
    best, best_gain = None, 0.0
    for j in range(old_rung + 1, min(proposed, len(rungs) - 1) + 1):
        cap = _cap_for(rungs[j], decision, cfg)
        extra = rungs[j].power_w(min(rate, cap)) - base_w
        gain = served(rungs[j], cap) - base_g
        if gain <= 0:
            continue
        if extra > 0 and time_under(temp_now, extra, limit, cfg.r_die_case_k_per_w,
                                    cfg.r_total_k_per_w, tau) < cfg.excursion_s:
            continue
        per_w = gain / extra if extra > 0 else math.inf
        if best is None or per_w > best_gain:
            best, best_gain = (j, cap, extra), per_w
    if best is None:
        return None
    j, cap, extra = best
    return _Actuation(j, cap, RungHold(j, t, t, s.hold.dwell_s), excursion=True, reason=(
        f"{temp_now:.1f} °C: an excursion to a richer rung for at least "
        f"{cfg.excursion_s:.0f} s ({extra:.2f} W more keeps the die under {limit:g} °C that "
        "long; it steps back when the governor asks)"))


def _guard_upgrade(s: ControlState, rungs: Sequence[Rung], cfg: ControlConfig,
                   decision: gov.Decision, temp_now: float | None, slope: float, now: int,
                   want: _Actuation, proposed: int, t: float) -> tuple[_Actuation, str]:
    """The upgrade guard (module doc): a step up only when its extra power would settle under
    the control trip; else an excursion, else the smaller step, else hold everything.
    Returns the actuation and, when an upgrade the budget allows is not taken, why."""
    g = cfg.governor
    if (s.actuation is None or g is None or temp_now is None
            or cfg.r_total_k_per_w is None):
        return want, ""
    rate = cfg.rate_hz
    r_total = cfg.r_total_k_per_w
    old_rung, old_cap = s.actuation
    old_rung = min(old_rung, len(rungs) - 1)
    limit = g.control_c - cfg.guard_margin_c

    def settles(r: int, c: float) -> tuple[float, float]:
        extra = rungs[r].power_w(min(rate, c)) - rungs[old_rung].power_w(min(rate, old_cap))
        return extra, temp_now + extra * r_total

    extra, settle = settles(want.rung, want.cap)
    if extra > 0 and s.excursion is not None:
        # what runs is not safe at steady state: a step up from it is not judged from it
        return (_Actuation(old_rung, old_cap, replace(s.hold, rung=now), want.reason),
                "on an excursion: no richer rung or rate until it ends")
    if extra > 0 and settle >= limit:
        refused = (f"{rungs[want.rung].variant_id} would settle near {settle:.1f} °C, over "
                   f"{limit:g} °C")
        if want.rung > old_rung:
            trip = _excursion(s, rungs, cfg, decision, temp_now, slope, proposed, t)
            if trip is not None:
                return trip, ""
        # Too big a step: try the smaller one (the rung running now at the rate the
        # budget allows it), else hold everything.
        cap_old = _cap_for(rungs[old_rung], decision, cfg)
        small, small_settle = settles(old_rung, cap_old)
        reason = want.reason
        if small > 0 and small_settle < limit:
            cap = cap_old
        else:
            # Else the highest of the rate steps (power/rungs.py RATE_STEPS) between what
            # runs and what the budget allows that still settles under the limit: holding
            # instead left the die at minimum duty for hours, 4 °C under the trip, whenever
            # the budget had come back all at once (rpi5/sun with a noisy sensor).
            cap = old_cap
            reason = (f"{temp_now:.1f} °C; {extra:.2f} W more would settle near "
                      f"{settle:.1f} °C, over {limit:g} °C: holding")
            top = min(rate, cap_old, rungs[old_rung].max_rate_hz())
            for k in RATE_STEPS:
                hz = top * k
                if hz <= min(old_cap, rate) * 1.001:
                    break
                _, at = settles(old_rung, hz)
                if at < limit:
                    cap = hz
                    reason = (f"{temp_now:.1f} °C: up to {hz:.3g} Hz, which settles near "
                              f"{at:.1f} °C, under {limit:g} °C ({extra:.2f} W more would "
                              f"settle near {settle:.1f} °C)")
                    break
        return _Actuation(old_rung, cap, replace(s.hold, rung=now), reason), refused
    if want.rung > old_rung:
        return replace(want, reason=(f"{temp_now:.1f} °C: room for a richer rung (settles "
                                     f"near {settle:.1f} °C, under {limit:g} °C)")), ""
    return want, ""


def _refused_by_hold(s: ControlState, rungs: Sequence[Rung], proposed: int, now: int,
                     want: _Actuation, t: float) -> str:
    """Why the rung hold keeps a richer rung the budget allows from running yet ("": it
    does not)."""
    if proposed <= now or want.rung > now:
        return ""
    if s.excursion is not None:
        return "on an excursion: no richer rung until it ends"
    h = want.hold
    dwell = h.dwell_s if h.dwell_s is not None else 0.0
    left = h.last_change_t + dwell - t
    return (f"rung hold: {rungs[min(now + 1, len(rungs) - 1)].variant_id} in {left:.0f} s "
            f"(dwell {dwell:.0f} s)") if left > 0 else ""


def _end_excursion(s: ControlState, rungs: Sequence[Rung], cfg: ControlConfig,
                   decision: gov.Decision, want: _Actuation, t: float
                   ) -> tuple[ControlState, _Actuation]:
    """On an excursion: back to where it came from in one step as soon as the budget no
    longer fits what runs (the governor asks down), or over once the die has settled on it
    (three case time constants: it is safe at steady state, no longer an excursion)."""
    if s.excursion is None or s.actuation is None:
        return s, want
    rung_from, _cap_from, since = s.excursion
    now_rung, now_cap = s.actuation
    if want.rung < now_rung or want.cap < now_cap:
        back = min(want.rung, rung_from)
        act = _Actuation(back, _cap_for(rungs[back], decision, cfg),
                         hold(replace(s.hold, rung=now_rung), back, t, cfg.dwell_s,
                              cfg.max_dwell_s),
                         f"excursion over: {want.reason}")
        return replace(s, excursion=None), act
    if cfg.case_tau_s is not None and t - since >= 3 * cfg.case_tau_s:
        return replace(s, excursion=None), want
    return s, want


def _physics_bounded(s: ControlState, cfg: ControlConfig, rung: int, cap: float,
                     temp_now: float | None, t: float,
                     events: list[ControlEvent]) -> ControlState:
    """Minimum duty and still above the control temperature for `bounded_after_s`: one
    critical event; one info event when the die is back under control."""
    g = cfg.governor
    at_bottom = rung == 0 and cap <= cfg.min_rate_hz * 1.001
    if g is not None and temp_now is not None and at_bottom and temp_now >= g.control_c:
        since = s.bottom_since if s.bottom_since is not None else t
        s = replace(s, bottom_since=since)
        if not s.bounded and t - since >= cfg.bounded_after_s:
            s = replace(s, bounded=True)
            events.append(ControlEvent("physics_bounded", "critical", (
                f"{temp_now:.1f} °C at minimum duty ({cfg.min_rate_hz:g} Hz on the cheapest "
                f"rung) for {t - since:.0f} s, above the {g.control_c:g} °C trip: idle power "
                "alone keeps the die above it at this ambient; edgerun cannot hold it below "
                "(cooling or a lower ambient is needed)")))
    elif temp_now is None or g is None or temp_now < g.control_c - g.hyst_c or not at_bottom:
        if s.bounded:
            events.append(ControlEvent("physics_bounded_cleared", "info",
                                       "the die is back under control"))
        s = replace(s, bottom_since=None, bounded=False)
    return s


def step(state: ControlState, r: Reading, rungs: Sequence[Rung], cfg: ControlConfig,
         current: int | None = None, operator_rate_hz: float = math.inf,
         extra: gov.Decision | None = None) -> tuple[ControlState, Output]:
    """One control tick (see module doc). `current` is the rung actually running (a switch can
    fail); `operator_rate_hz` is the operator's own cap (math.inf = none); `extra` is one more
    budget to respect (a bench's baseline energy policy, in dynamic watts: the floor is added),
    the stricter wins."""
    events: list[ControlEvent] = []
    s, seen = _sense(state, r, cfg, ran_w(state, rungs, cfg, current), events)
    s, decision = _policies(s, r, seen, rungs, cfg, extra, events)
    now, want, proposed = _budget_to_rung(s, rungs, cfg, decision, current, r.t)
    s, want = _end_excursion(s, rungs, cfg, decision, want, r.t)
    refused = _refused_by_hold(s, rungs, proposed, now, want, r.t)
    act, why_not = _guard_upgrade(s, rungs, cfg, decision, seen.temp_c, seen.slope, now, want,
                                  proposed, r.t)
    refused = why_not or refused
    if act.excursion and s.actuation is not None:
        s = replace(s, excursion=(*s.actuation, r.t))
    cap = min(act.cap, operator_rate_hz)
    # what runs, the operator's cap included: the guard judges the next step from it, so
    # lifting that cap is a step up like any other
    if s.actuation is not None and (act.rung, cap) != s.actuation:
        s = replace(s, samples=s.samples[-1:])  # a new regime: restart the trend
    s = replace(s, hold=act.hold, actuation=(act.rung, cap))
    s = _physics_bounded(s, cfg, act.rung, cap, seen.temp_c, r.t, events)
    return s, Output(act.rung, cap, decision.budget_w, decision.level, act.reason, seen.temp_c,
                     seen.slope * 60, tuple(events), refused)
