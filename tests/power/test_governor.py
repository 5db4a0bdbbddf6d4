"""Table tests for the pure governors (paced by the core's timers, as the control step runs
them), the budget-to-rung mapping, the rung hold and the energy budget."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from power import energy
from power.control import ControlConfig, thermal_step
from power.governor import Decision, GovernorConfig, GovernorState, Trend, combine, step
from power.rungs import Rung, select_for_budget
from power.sensors import Reading
from power.timers import LevelTimers, RungHold, hold

LEVELS = (math.inf, 6.0, 3.0, 1.5)
SW = GovernorConfig(control_c=80, critical_c=100, sustainable_w=4.0, max_w=10.0,
                    levels_w=LEVELS, horizon_s=20)
PA = GovernorConfig(**{**SW.__dict__, "policy": "power_allocator"})
TIMERS = ControlConfig(None, dwell_s=30)  # the core's timers: settle 10 s, dwell 30 s


def run(cfg, temps, dt=1.0, state=None, timers=None):
    """Feed a temperature series (a float, or (°C, slope °C/s)) through the policy paced by
    the core's timers; return (state, timers), levels, budgets and events. A bare float's
    slope is its difference to the previous one (the core's job, tested in
    test_control.py)."""
    s, tm = state or GovernorState(), timers or LevelTimers()
    levels, budgets, events = [], [], []
    prev = None
    for i, x in enumerate(temps):
        temp, slope = x if isinstance(x, tuple) else (x, 0.0 if prev is None else
                                                      (x - prev) / dt)
        prev = temp
        s, tm, d = thermal_step(s, tm, Trend(i * dt, temp, slope), cfg, TIMERS)
        levels.append(d.level)
        budgets.append(d.budget_w)
        events.extend(d.events)
    return (s, tm), levels, budgets, events


STEP_WISE = [
    # name, temperatures (1 s apart), expected level sequence
    ("cool and steady: no restriction", [50.0] * 5, [0, 0, 0, 0, 0]),
    ("over the trip and rising: one level per tick", [79, 81, 83, 85, 87],
     [0, 1, 2, 3, 3]),
    ("predictive: rising fast below the trip escalates before it",
     [70, 72, 74, 76, 78], [0, 1, 2, 3, 3]),
    ("slow rise far below the trip: no action", [70, 70.1, 70.2, 70.3, 70.4], [0, 0, 0, 0, 0]),
    ("over the trip but falling: hold (no release above trip - hyst)",
     [79, 82, 84, 81, 80.5, 80.5, 80.5, 80.5], [0, 1, 2, 2, 2, 2, 2, 2]),
    ("near critical: straight to the bottom", [60, 98], [0, 3]),
    ("creeping inside the band under the trip, too slowly for the horizon: one level per "
     "settle_s before the trip", [(79.0, 0.01)] + [(79.85, 0.005)] * 11, [0] + [1] * 10 + [2]),
    ("no trend inside the band (blind after a step, or too small to see): hold",
     [(79.85, 0.0)] * 12, [0] * 12),
    ("falling slowly inside the band: hold", [(79.85, -0.001)] * 12, [0] * 12),
    ("no trend above the trip: one level per settle_s", [(80.2, 0.0)] * 12, [1] * 10 + [2, 2]),
]


@pytest.mark.parametrize(("name", "temps", "want"), STEP_WISE, ids=[c[0] for c in STEP_WISE])
def test_step_wise(name, temps, want):
    _, levels, budgets, _ = run(SW, temps)
    # the budget is the level in force's, also while the core's pacing holds a level the
    # policy asked to leave (a held level with the asked level's budget moves the rung early)
    assert levels == want and budgets == [LEVELS[lv] for lv in levels]


# The edges of step_wise's rules on SW (trip 80 °C, hysteresis 3, band 0.3, horizon 20 s,
# critical 100 - 3): name, °C, slope °C/s, level in force, (level asked, gate)
STEP_WISE_EDGES = [
    ("predicted to reach the trip exactly at the horizon: up at once", 70.0, 0.5, 0,
     (1, "up")),
    ("predicted just under the trip at the horizon: hold", 70.0, 0.49, 0, (0, "now")),
    ("rising at the band's lower edge: up after the settle time", 79.7, 0.001, 0,
     (1, "settle")),
    ("rising just under the band: hold", 79.6, 0.001, 0, (0, "now")),
    ("exactly the critical margin: straight to the bottom", 97.0, 0.0, 0, (3, "now")),
    ("exactly trip - hysteresis: no release yet", 77.0, 0.0, 2, (2, "now")),
    ("just under trip - hysteresis: a release after the dwell", 76.9, 0.0, 2, (1, "dwell")),
]


@pytest.mark.parametrize(("name", "temp", "slope", "level", "want"), STEP_WISE_EDGES,
                         ids=[c[0] for c in STEP_WISE_EDGES])
def test_step_wise_edges(name, temp, slope, level, want):
    _, d = step(GovernorState(level=level), Trend(5.0, temp, slope), SW)
    assert (d.level, d.gate) == want


def test_step_wise_releases_one_level_after_dwell():
    (s, tm), levels, _, _ = run(SW, [79, 81, 83, 85])
    assert levels[-1] == 3
    _, levels, _, events = run(SW, [70.0] * 100, state=s, timers=tm)
    # t restarts at 0 in the second run but last_change was at t=3: the dwell still applies
    first_release = levels.index(2)
    assert first_release >= 30 - 3
    assert levels[-1] < 3 and all(b - a in (0, -1) for a, b in itertools.pairwise(levels))
    assert any("release" in e for e in events)


def test_step_wise_flapping_input_backs_off():
    """A temperature that bounces around the trip must not make the level bounce each time."""
    temps = []
    for _ in range(20):
        temps += [81, 82, 83] + [70.0] * 60
    _, levels, _, _ = run(SW, temps)
    changes = sum(1 for a, b in itertools.pairwise(levels) if a != b)
    naive = 20 * 2  # one escalation and one release per bounce
    assert changes < naive


def test_a_climb_after_an_early_release_doubles_the_dwell_once():
    """Back-off is per release undone, not per step of the climb that undoes it: five steps
    up right after a release made one early release cost the longest dwell."""
    tm = LevelTimers(last_change_t=-5.0, last_release_t=-5.0, dwell_s=30.0)
    (_, tm), levels, _, _ = run(SW, [(80.5, 0.5)] * 3, state=GovernorState(level=1), timers=tm)
    assert levels == [2, 3, 3] and tm.dwell_s == 60.0


def test_the_band_never_reaches_into_the_release_zone():
    """A profile's hysteresis under the band: the band shrinks to half of it (a level
    stepped up in the band is never also released there)."""
    cfg = replace(SW, hyst_c=0.2)
    _, levels, _, _ = run(cfg, [(79.85, 0.001)] * 12)  # under 80 - 0.1: not in the band
    assert levels == [0] * 12


def test_invalid_sensor_fails_safe_then_recovers():
    s, tm, d = thermal_step(GovernorState(), LevelTimers(),
                            Trend(0.0, None, problem="zone gone"), SW, TIMERS)
    assert d.level == 3 and d.budget_w == LEVELS[-1]
    # one event: the fail-safe says it all, no `level 0 -> 3` beside it
    assert len(d.events) == 1 and "treating the device as hot" in d.events[0]
    s, tm, d = thermal_step(s, tm, Trend(1.0, None, problem="zone gone"), SW, TIMERS)
    assert d.events == ()  # said once, not every tick
    s, tm, d = thermal_step(s, tm, Trend(2.0, 50.0), SW, TIMERS)
    assert any("reads again" in e for e in d.events)
    s, tm, d = thermal_step(s, tm, Trend(3.0, 50.0), SW, TIMERS)
    assert d.events == ()  # said once: the fail-safe is over
    s, tm, d = thermal_step(s, tm, Trend(4.0, None, problem="zone gone"), SW, TIMERS)
    assert len(d.events) == 1 and "treating the device as hot" in d.events[0]  # said again


def test_the_policy_keeps_no_timer():
    """step_wise asks and names the gate; the level in force is the core's to set."""
    s = GovernorState(level=2)
    _, d = step(s, Trend(5.0, 70.0), SW)
    assert (d.level, d.gate) == (1, "dwell")
    _, d = step(s, Trend(5.0, 80.2), SW)
    assert (d.level, d.gate) == (3, "settle")
    _, d = step(s, Trend(5.0, 79.0, 0.1), SW)
    assert (d.level, d.gate) == (3, "up")
    _, d = step(s, Trend(5.0, 98.0), SW)
    assert (d.level, d.gate) == (3, "now")


POWER_ALLOCATOR = [
    ("below switch-on: full power", [60.0, 60.0], lambda b: all(x == math.inf for x in b)),
    ("at control: about the sustainable power", [80.0] * 3,
     lambda b: abs(b[-1] - 4.0) < 1.0),
    ("above control: less than sustainable", [85.0] * 3, lambda b: b[-1] < 4.0),
    ("near critical: zero", [98.0], lambda b: b[-1] == 0.0),
    ("rising towards control cuts the budget early", [72, 74, 76, 78],
     lambda b: b[-1] < 4.0),
]


@pytest.mark.parametrize(("name", "temps", "check"), POWER_ALLOCATOR,
                         ids=[c[0] for c in POWER_ALLOCATOR])
def test_power_allocator(name, temps, check):
    assert check(run(PA, temps)[2])


# PA's PID by hand (trip 80 °C, T_on 70, S 4 W, max 10 W, floor 0): k_po = 4/10 = 0.4 W/°C
# above control, k_pu = 0.8 W/°C under it, k_i = 0.08 W/°C/s; name, trends, last budget
PA_BY_HAND = [
    ("over control: the gentle gain", [Trend(0.0, 85.0)], 4.0 - 0.4 * 5),
    ("under control: the steep gain", [Trend(0.0, 75.0)], 4.0 + 0.8 * 5),
    ("room for the top rung: no limit", [Trend(0.0, 70.5)], math.inf),  # 4 + 7.6 >= 10 W
    ("under switch-on but predicted over it: the PID acts", [Trend(0.0, 65.0, 0.5)],
     4.0 + 0.8 * 5),  # predicted 75 °C
    ("the integral adds k_i x e x dt", [Trend(0.0, 82.0), Trend(10.0, 82.0)],
     4.0 - 0.4 * 2 - 0.08 * 2 * 10),
    ("a long hot spell winds the integral no further than the top",
     [Trend(0.0, 85.0), Trend(100.0, 85.0), Trend(110.0, 75.0)],
     4.0 + 0.8 * 5 + (-10.0 + 0.08 * 5 * 10)),  # clamped at -10 W, then +4 W
    ("device time stepping back adds nothing to the integral",
     [Trend(1000.0, 85.0), Trend(0.0, 85.0)], 4.0 - 0.4 * 5),
    # the fail-safe resets the integral and times the next step from its own last tick: the
    # integral after it is one second's, not the spell's nor the one wound before it
    ("a fail-safe spell resets the integral and its time",
     [Trend(0.0, 82.0), Trend(10.0, 82.0), Trend(20.0, None), Trend(21.0, 82.0)],
     4.0 - 0.4 * 2 - 0.08 * 2 * 1),
    # the budget exactly at a boundary: the top rung's, and the critical margin's
    ("exactly room for the top rung: no limit", [Trend(0.0, 72.5)], math.inf),  # 4 + 6 W
    ("exactly the critical margin resets the integral",  # else -10 W wound at 97 °C
     [Trend(0.0, 97.0), Trend(10.0, 97.0), Trend(20.0, 75.0)], math.inf),  # 4 + 4 + 4 W
]


@pytest.mark.parametrize(("name", "trends", "want"), PA_BY_HAND, ids=[c[0] for c in PA_BY_HAND])
def test_power_allocator_by_hand(name, trends, want):
    s, d = GovernorState(), None
    for tr in trends:
        s, d = step(s, tr, PA)
    assert d.budget_w == pytest.approx(want)


def test_a_budget_exactly_on_a_level_reports_that_level():
    """power_allocator's budget is reported as the step_wise level it equals (6 W: level 1,
    at 77.5 °C: 4 + 0.8 x 2.5 W), not the one under it."""
    _, d = step(GovernorState(), Trend(0.0, 77.5), PA)
    assert (d.budget_w, d.level) == (6.0, 1)


def test_power_allocator_integral_pulls_down_when_stuck_hot():
    _, _, budgets, _ = run(PA, [82.0] * 60)
    assert budgets[-1] < budgets[1]


RUNGS = [Rung("small", 0.69, 0.010, 0.01), Rung("mid", 0.73, 0.030, 0.02),
         Rung("big", 0.76, 0.100, 0.05)]

BUDGET = [
    # budget W, rate Hz, current, expected (index, rate)
    (math.inf, 10, None, (2, 10)),
    (1.0, 10, None, (2, 10)),  # big at 10 Hz = 1.0 W fits exactly
    (0.5, 10, None, (1, 10)),
    (0.05, 10, None, (0, 5.0)),  # nothing fits at 10 Hz: small at the rate the budget allows
    (0.0, 10, None, (0, 0.0)),  # 0 Hz here; control.step turns it into minimum duty
    (1.05, 10, 1, (1, 10)),  # big fits, but not with the 10% margin: stay on mid
    (1.2, 10, 1, (2, 10)),
    (0.2, 10, 2, (0, 10)),  # stepping down needs no margin
]


@pytest.mark.parametrize(("rung", "rate", "power_w", "box_w"), [
    (Rung("r", 0.9, 0.1, 0.02), 10.0, 1.0, 3.0),  # 50/s at most: 10 Hz as asked
    (Rung("r", 0.9, 0.1, 0.2), 10.0, 0.5, 2.5),  # 5/s at most: no more drawn past it
    (Rung("r", 0.9, 0.1, 0.2, parallel=4), 10.0, 1.0, 3.0),  # 20/s on four cores
    (Rung("r", 0.9, 0.1, 0.02, other_j=0.05), 10.0, 1.5, 3.5),  # the stages around it
])
def test_a_rungs_power_at_a_rate(rung, rate, power_w, box_w):
    """Dynamic power = energy per frame x the rate, capped at what the rung sustains; the
    box adds its floor (2 W here)."""
    assert rung.power_w(rate) == pytest.approx(power_w)
    assert rung.box_w(rate, 2.0) == pytest.approx(box_w)


def test_select_for_budget_with_rungs_whose_energy_does_not_rise_with_the_index():
    """Live energies can reorder a ladder: current does not fit, nothing above it has the
    margin. It must pick a fitting rung, not raise (found: 1762 failed control ticks)."""
    rungs = [Rung("s", 0.8, 0.4e-3, 1e-3), Rung("m", 0.9, 0.1e-3, 1e-3),
             Rung("t", 0.95, 0.2e-3, 1e-3)]
    assert select_for_budget(rungs, 0.00105, 10.0, current=0) == (1, 10.0)


# At 10 Hz: a 0.1 W, b 1.0 W, c 0.98 W (live energies: c is cheaper than b)
LIVE = [Rung("a", 0.7, 0.010, 1e-3), Rung("b", 0.8, 0.100, 1e-3), Rung("c", 0.9, 0.098, 1e-3)]


@pytest.mark.parametrize(("name", "budget", "current", "want"), [
    ("the running rung keeps its place while it fits: c lacks the margin", 1.01, 1, 1),
    ("c with the margin: up", 1.08, 1, 2),
])
def test_select_for_budget_with_live_energies(name, budget, current, want):
    assert select_for_budget(LIVE, budget, 10.0, current) == (want, 10.0)


@pytest.mark.parametrize(("budget", "rate", "current", "want"), BUDGET)
def test_select_for_budget(budget, rate, current, want):
    i, r = select_for_budget(RUNGS, budget, rate, current)
    assert (i, pytest.approx(r)) == (want[0], pytest.approx(want[1]))


@pytest.mark.parametrize(("steps", "want_rungs", "want_dwell"), [
    # (proposed, t) sequence from rung 2 with base dwell 30
    ([(0, 10)], [0], 30),  # down at once
    ([(0, 10), (2, 20)], [0, 0], 30),  # up waits for the dwell
    ([(0, 10), (2, 40), (2, 70)], [0, 1, 2], 30),  # then one rung at a time
    ([(0, 10), (2, 40), (0, 50)], [0, 1, 0], 60),  # an upgrade undone fast doubles the dwell
    ([(0, 10), (2, 40), (0, 50), (2, 100), (2, 111)], [0, 1, 0, 0, 1], 60),
    ([(0, 10), (2, 40), (0, 50), (2, 400)], [0, 1, 0, 1], 30),  # a quiet period resets it
    ([(1, 10), (1, 20), (1, 30)], [1, 1, 1], 30),  # no change, no effect
    ([(0, 10), (2, 40), (0, 100)], [0, 1, 0], 60),  # undone within four dwells: doubles too
    ([(0, 10), (2, 40), (0, 50), (2, 230)], [0, 1, 0, 1], 60),  # 3 dwells quiet: kept
])
def test_hold_table(steps, want_rungs, want_dwell):
    state = RungHold(2)
    got = []
    for proposed, t in steps:
        state = hold(state, proposed, t, 30.0, 900.0)
        got.append(state.rung)
    assert got == want_rungs and state.dwell_s == want_dwell


def test_hold_caps_the_dwell():
    state = RungHold(2)
    t = 0.0
    for _ in range(20):  # upgrade, then undone at once, forever
        t += state.dwell_s or 30
        state = hold(state, 3, t, 30.0, 240.0)
        t += 1
        state = hold(state, 2, t, 30.0, 240.0)
    assert state.dwell_s == 240.0


def test_combine_stricter_wins():
    d = combine(Decision(3.0, level=2, reason="thermal", events=("a",)),
                Decision(math.inf, 2.0, level=0, reason="energy", events=("b",)))
    assert (d.budget_w, d.rate_cap_hz, d.level, d.reason, d.events) == (
        3.0, 2.0, 2, "thermal", ("a", "b"))


ECFG = energy.EnergyConfig(capacity_wh=100, idle_w=1.0, max_w=5.0, reserve_frac=0.2,
                           charge_efficiency=1.0, forecast_margin=0.0, buffer_h=0.0)


@pytest.mark.parametrize(("battery", "forecast", "check"), [
    (20.0, (0.0,) * 24, lambda p: p == 0.0),  # at reserve: nothing
    (100.0, (0.0,) * 24, lambda p: 0 < p < 5),  # full, no sun: spread 80 Wh over the day
    (100.0, (50.0,) * 24, lambda p: p == 5.0),  # sun all day: everything
    (30.0, (0.0,) * 24, lambda p: p == 0.0),  # idle alone would cross the reserve
])
def test_plan_power(battery, forecast, check):
    assert check(energy.plan_power(battery, 0.0, forecast, ECFG))


# plan_power by hand on ECFG (idle 1 W, reserve 20 Wh, 24 one-hour slots, efficiency 1, no
# margin, no buffer, 5 W max) and one setting changed: name, battery Wh, forecast Wh per slot,
# t, changed settings, the plan W
PLAN_BY_HAND = [
    ("the forecast margin discounts the harvest", 100.0, (1.0,) * 24, 0.0,
     {"forecast_margin": 0.5}, 80 / 24 - 0.5),  # 0.5 Wh of each slot's 1 Wh
    ("charging loses to the charge efficiency", 50.0, (10.0,) * 12 + (0.0,) * 12, 0.0,
     {"charge_efficiency": 0.5}, 4.0),  # 50 + 12 x 0.5 x (9 - 4) = 80, - 12 x 5 = 20
    ("a full battery stores no more", 90.0, (10.0,) * 12 + (0.0,) * 12, 0.0,
     {"max_w": 10.0}, 80 / 12 - 1),  # full by noon, then 80 Wh over 12 h of night
    ("the slot under way counts only its rest", 100.0, (0.0,) * 24, 1800.0, {},
     80 / 23.5 - 1),
    ("a buffer over the battery still plans on its top 10 %", 95.0, (50.0,) * 24, 0.0,
     {"buffer_h": 100.0}, 5.0),
]


@pytest.mark.parametrize(("name", "battery", "forecast", "t", "changed", "want"), PLAN_BY_HAND,
                         ids=[c[0] for c in PLAN_BY_HAND])
def test_plan_power_by_hand(name, battery, forecast, t, changed, want):
    got = energy.plan_power(battery, t, forecast, replace(ECFG, **changed))
    assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("harvest_w", "want_wh"), [((0.0, 10.0), 5.0), ((10.0, 0.0), 5.0),
                                                     ((10.0, 10.0), 10.0)])
def test_the_harvest_between_two_readings_is_their_mean(harvest_w, want_wh):
    """An hour between two readings: the slot's harvest is the trapezoid, not the last."""
    s = energy.initial_state(ECFG)
    for t, w in zip((0.0, 3600.0), harvest_w, strict=True):
        s, _ = energy.step(s, Reading(t, battery_wh=90.0, harvest_w=w), ECFG)
    assert s.forecast_wh[0] == pytest.approx(want_wh)


def test_plan_power_no_sun_keeps_reserve_exactly():
    p = energy.plan_power(100.0, 0.0, (0.0,) * 24, ECFG)
    assert (1.0 + p) * 24 == pytest.approx(80.0, abs=0.01)


def test_plan_power_keeps_the_idle_buffer_above_the_reserve():
    cfg = replace(ECFG, buffer_h=12.0)  # floor = 20 Wh + 12 h x 1 W
    p = energy.plan_power(100.0, 0.0, (0.0,) * 24, cfg)
    assert (1.0 + p) * 24 == pytest.approx(100.0 - 32.0, abs=0.01)
    assert energy.plan_power(32.0, 0.0, (50.0,) * 24, cfg) == 0.0


def test_plan_power_neutral_and_known_future():
    assert energy.plan_power(100.0, 0.0, (0.0,) * 24, replace(ECFG, neutral=True)) == 0.0
    # `ahead` (the oracle) overrides the cyclic forecast: sun known to come in the next slots
    sunny = energy.plan_power(50.0, 0.0, (0.0,) * 24, ECFG, ahead=(100.0,) * 24)
    assert sunny == 5.0


def test_energy_forecast_learns_slots_and_fails_safe():
    s = energy.initial_state(ECFG)
    for t in range(0, 2 * 3600 + 1, 60):  # 10 W harvest for two hours
        s, d = energy.step(s, Reading(float(t), battery_wh=90.0, harvest_w=10.0), ECFG)
    assert s.forecast_wh[0] == pytest.approx(10.0, rel=0.02)
    assert s.forecast_wh[1] == pytest.approx(10.0, rel=0.02)
    s, d = energy.step(s, Reading(8000.0, problems=("BAT0 gone",)), ECFG)
    assert d.budget_w == 0.0 and "treating the battery as low" in d.events[0]
    s, d = energy.step(s, Reading(8060.0, battery_wh=90.0, harvest_w=0.0), ECFG)
    assert "reads again" in d.events[0]


def test_persistence_forecast_plans_on_another_cloudy_day():
    """Two sunny days then a cloudy one: the EWMA still expects sun, persistence does not."""
    def run(persistence: bool) -> float:
        cfg = replace(ECFG, persistence=persistence)
        s = energy.initial_state(cfg)
        d = None
        for day, sun_w in enumerate((20.0, 20.0, 1.0)):
            for minute in range(0, 24 * 60, 10):
                t = day * 86400 + minute * 60.0
                harvest = sun_w if 6 * 60 <= minute < 18 * 60 else 0.0
                s, d = energy.step(s, Reading(t, battery_wh=60.0, harvest_w=harvest), cfg)
        s, d = energy.step(s, Reading(3 * 86400.0, battery_wh=60.0, harvest_w=0.0), cfg)
        return d.budget_w

    assert run(True) < run(False)
