"""One battery, one planner: with duty cycling (docs/sleep.md) the control step's energy
budget must not plan rungs as if the box drew its awake idle power all the time.

The fault (an outside run, 2026-12-07): on the solar node at 50 Wh with no harvest forecast
yet, the control step's energy budget (idle floor 1.2 W for 24 h) planned 0.00 W and took the
ladder to its cheapest rung at minimum duty, while the sleep planner at the same moment
(power/duty_cycle.py, the suspended floor) had 1.186 W and afforded the whole schedule.
"""

from __future__ import annotations

import math

import pytest
from support.governor_day import ladder

from power import control
from power import duty_cycle as dc
from power.control_settings import control_config
from power.sensors import Reading
from power.thermal_source import ThermalSource
from runtime.config import GovernorSection
from runtime.device.profiles import load_profile

DEV = load_profile("solar-node")
RUNGS = ladder(DEV, 0.9)
TOP = len(RUNGS) - 1
THERMAL = ThermalSource("t", "zone", tuple(DEV.thermal.trips), "sysfs")
RATE = 2.0  # Hz the camera offers ([governor] rate_hz)
SCHEDULE = dc.Schedule(every_s=300, burst=2)
T0 = 9 * 3600.0


def run(duty_cycled: bool, battery_wh: float | None, temp_c: float = 30.0, ticks: int = 5,
        hold_s: float = 30.0) -> tuple[control.ControlConfig, control.ControlState,
                                       control.Output, list[str]]:
    """`ticks` control steps 2 s apart from the top rung; the last output and every
    event's detail."""
    cfg = control_config(DEV, GovernorSection(hold_invalid_s=hold_s), THERMAL, RATE,
                         duty_cycled=duty_cycled)
    s, out, rung, events = control.ControlState(), None, TOP, []
    for k in range(ticks):
        r = Reading(T0 + 2.0 * k, temp_c=temp_c, battery_wh=battery_wh, harvest_w=0.0,
                    problems=() if battery_wh is not None else ("no battery",))
        s, out = control.step(s, r, RUNGS, cfg, rung)
        rung = out.rung
        events += [e.detail for e in out.events]
    assert out is not None
    return cfg, s, out, events


def test_the_two_planners_saw_different_budgets_on_one_battery():
    """The numbers of the fault: 0 W above the idle floor, 1.186 W above the suspended one."""
    cfg, s, _, _ = run(False, 50.0)
    forecast = dc.planning_forecast(s.energy, cfg.energy)
    budget = dc.affordable_w(50.0, T0, forecast, cfg.energy, dc.WakeCost.of(DEV))
    assert budget == pytest.approx(1.186, abs=1e-3)
    rung = RUNGS[TOP]
    p = dc.plan(SCHEDULE, dc.WakeCost.of(DEV), rung.energy_j, rung.latency_s, budget)
    assert p.mode == "sleep" and not p.over_budget and p.period_s == 300


@pytest.mark.parametrize("duty_cycled, battery_wh, temp_c, rung, capped", [
    # awake solar node (no [sleep], or a board that cannot suspend): unchanged, the energy
    # budget at the idle floor plans 0 W: the cheapest rung at minimum duty
    (False, 50.0, 30.0, 0, True),
    # a full battery: the top rung either way
    (False, 95.0, 30.0, TOP, False),
    (True, 95.0, 30.0, TOP, False),
    # duty cycling: the sleep plan spends the battery; the rung is the thermal governor's
    (True, 50.0, 30.0, TOP, False),
    (True, 22.0, 30.0, TOP, False),  # even near the reserve: the plan moves bursts apart
    # the thermal governor still binds while awake: far over the passive trip, it steps
    # down (None: below the top rung)
    (True, 50.0, 86.0, None, None),
])
def test_who_picks_the_rung(duty_cycled, battery_wh, temp_c, rung, capped):
    _, _, out, _ = run(duty_cycled, battery_wh, temp_c)
    assert out.rung < TOP if rung is None else out.rung == rung, out.reason
    if capped is not None:
        assert math.isfinite(out.rate_cap_hz) is capped, out


def test_duty_cycling_still_learns_the_forecast_the_sleep_plan_uses():
    """The energy state goes on accumulating the harvest (power/duty_cycle.py plans on it)."""
    _, s, _, _ = run(True, 50.0)
    assert s.energy is not None and s.energy.last_t == T0 + 8.0


def test_no_battery_reading_still_fails_safe_with_duty_cycling():
    """The energy budget's fail-safe (a dead battery sensor past the hold is a low battery:
    inference paused at minimum duty) is kept: its event says so and stays true."""
    _, _, out, events = run(True, None, hold_s=0.0)
    assert out.rung == 0 and out.rate_cap_hz == pytest.approx(0.2), out
    assert any("battery sensor invalid" in e for e in events), events
