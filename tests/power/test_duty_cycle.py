"""power/duty_cycle.py: break-even, mode and rate choice, budget from the forecast."""

from __future__ import annotations

import math

import pytest

from power import duty_cycle as dc
from power import energy as energy_mod
from runtime.device.profiles import load_profile

SOLAR = dc.WakeCost.of(load_profile("solar-node"))
E, TI, D = 0.5, 0.2, 10.0  # J and s per inference, s connected per wake
# solar-node: transition 4 s / 5.7 J, camera 0.25 W with 2 s warm-up, idle 1.2, suspended 0.06
FIXED = 5.7 + 1.45 * 2.2 + 1.2 * 10 + 0.5 - 0.06 * 16.2  # J of one sleeping period above floor
AWAKE = 16.2


def test_profile_costs():
    assert dc.WakeCost(1.2, 0.06, 4.0, 5.7, 0.25, 2.0, True) == SOLAR
    pi = dc.WakeCost.of(load_profile("rpi5"))
    assert not pi.can_suspend and pi.suspended_w == pi.idle_w
    assert not dc.WakeCost.of(load_profile("generic-x86")).can_suspend


@pytest.mark.parametrize("schedule, budget, mode, period, per_hour, over", [
    # every 10 min, no energy limit: asleep between bursts
    (dc.Schedule(every_s=600), math.inf, "sleep", 600, 6.0, False),
    # every 10 s: shorter than the 16.2 s a wake takes, so stay up
    (dc.Schedule(every_s=10), math.inf, "stay_up", 10, 360.0, False),
    # 12 an hour = every 300 s
    (dc.Schedule(per_hour=12), math.inf, "sleep", 300, 12.0, False),
    # 0.1 W above the floor affords one wake every FIXED/0.1 s: fewer than requested
    (dc.Schedule(every_s=60), 0.1, "sleep", FIXED / 0.1, 3600 / (FIXED / 0.1), False),
    # the same budget affords the requested hourly schedule in full
    (dc.Schedule(every_s=3600), 0.1, "sleep", 3600, 1.0, False),
    # no budget at all: the hourly check-in, flagged
    (dc.Schedule(every_s=60), 0.0, "sleep", 3600, 1.0, True),
    # bursts of 5 every 20 min
    (dc.Schedule(every_s=1200, burst=5), math.inf, "sleep", 1200, 15.0, False),
])
def test_plan_table(schedule, budget, mode, period, per_hour, over):
    p = dc.plan(schedule, SOLAR, E, TI, budget, D)
    assert p.mode == mode, p.reason
    assert p.period_s == pytest.approx(period)
    assert p.per_hour == pytest.approx(per_hour)
    assert p.over_budget is over
    if not over and math.isfinite(budget):
        assert p.average_w - SOLAR.suspended_w <= budget + 1e-9
    assert p.average_w == pytest.approx(dc.average_w(p.mode, p.period_s, SOLAR, p.burst, E, TI,
                                                     D))


def test_sleep_energy_formula():
    assert dc.average_w("sleep", 600, SOLAR, 1, E, TI, D) == pytest.approx(0.06 + FIXED / 600)
    assert dc.average_w("stay_up", 600, SOLAR, 1, E, TI, D) == pytest.approx(1.45 + E / 600)
    assert dc.average_w("sleep", AWAKE - 0.1, SOLAR, 1, E, TI, D) == math.inf
    assert dc.awake_s(SOLAR, 1, TI, D) == pytest.approx(AWAKE)


def test_break_even_is_where_the_modes_cross():
    cost = dc.WakeCost(1.0, 0.1, 2.0, 30.0)  # an expensive wake: break-even above awake
    be = dc.break_even_s(cost, 1, E, TI, 0.0)
    assert be == pytest.approx((30 + 1.0 * 0.2 - 0.1 * 2.2) / 0.9)
    for f, cheaper in ((1.01, "sleep"), (0.99, "stay_up")):
        t = be * f
        up = dc.average_w("stay_up", t, cost, 1, E, TI, 0.0)
        down = dc.average_w("sleep", t, cost, 1, E, TI, 0.0)
        assert (down < up) is (cheaper == "sleep")
        assert dc.plan(dc.Schedule(every_s=t), cost, E, TI, math.inf, 0.0).mode == cheaper


def test_a_board_that_cannot_suspend_stays_up():
    pi = dc.WakeCost.of(load_profile("rpi5"))
    p = dc.plan(dc.Schedule(every_s=3600), pi, E, TI)
    assert p.mode == "stay_up" and p.sleep_s == 0 and math.isinf(p.break_even_s)
    # and with no budget it stays up at the requested rate (the energy budget caps it)
    assert dc.plan(dc.Schedule(every_s=60), pi, E, TI, 0.0).over_budget


def test_stay_up_when_the_budget_allows_and_it_is_cheaper():
    # every 12 s cannot sleep (16.2 s awake); a budget above the idle floor keeps it
    p = dc.plan(dc.Schedule(every_s=12), SOLAR, E, TI, 1.5, D)
    assert p.mode == "stay_up" and p.period_s == 12
    # below the idle floor staying up is impossible: bursts spread out, asleep between
    p = dc.plan(dc.Schedule(every_s=12), SOLAR, E, TI, 0.5, D)
    assert p.mode == "sleep" and p.period_s == pytest.approx(max(AWAKE, FIXED / 0.5))


@pytest.mark.parametrize("kw, key", [({}, "every_s"), ({"every_s": 1, "per_hour": 1}, "every_s"),
                                     ({"every_s": 0}, "every_s"), ({"per_hour": -1}, "per_hour"),
                                     ({"every_s": 60, "burst": 0}, "burst")])
def test_schedule_validation(kw, key):
    assert dc.Schedule(**kw).validate()[0] == key


def test_affordable_budget_uses_the_suspended_floor():
    # 10 Wh/day of harvest, a battery at 25 %: the idle floor (1.2 W = 28.8 Wh/day) affords
    # nothing, the suspended floor (0.06 W) affords most of the harvest (10 Wh x 0.8 margin
    # over 24 h = 0.33 W, plus the 5 Wh over the reserve)
    dev = load_profile("solar-node")
    b = dev.battery
    cfg = energy_mod.EnergyConfig(b.capacity_wh, dev.power.idle_w, math.inf, b.reserve_frac,
                                  b.charge_efficiency)
    day = tuple(10.0 / 12 if 6 <= h < 18 else 0.0 for h in range(24))
    idle_floor = energy_mod.plan_power(25.0, 0.0, day, cfg)
    budget = dc.affordable_w(25.0, 0.0, day, cfg, SOLAR)
    assert idle_floor == 0.0
    assert 0.25 < budget < 0.6
    # at the reserve: nothing
    assert dc.affordable_w(b.reserve_frac * b.capacity_wh, 0.0, day, cfg, SOLAR) == 0.0


# -- the bench's duty-cycling harness, short (bench/solar.py --sleep runs 14 days) -----------------

def _bench():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    import solar

    return solar


def test_sleeping_keeps_the_reserve_where_staying_up_cannot():
    solar = _bench()
    dev = load_profile("solar-node")
    days = 2
    irr = solar.day_trace([10.0] * days, dev.solar.panel_w, seed=1)
    slot_wh = (irr * dev.solar.panel_w * 300 / 3600).reshape(-1, 12).sum(axis=1)
    assert slot_wh.sum() == pytest.approx(10.0 * days, rel=1e-6)
    sched = dc.Schedule(every_s=300)
    runs = {p: solar.run_duty(dev, irr, p, sched, 0.0004, 0.001, days, slot_wh,
                              battery_frac=0.3) for p in ("awake", "sleep", "oracle")}
    # staying up: 1.2 W against 10 Wh/day drains through the reserve whatever it infers
    assert runs["awake"].below_reserve_h > 10
    # asleep between bursts: 0.06 W x 48 h = 2.9 Wh of floor < 20 Wh of harvest: never below
    assert runs["sleep"].below_reserve_h == 0
    assert runs["sleep"].wakes > 0 and runs["sleep"].suspended_h > 0.8 * 24 * days
    assert runs["sleep"].delivered >= 0.9 * runs["oracle"].delivered
    assert runs["sleep"].delivered > runs["awake"].delivered
