"""Table tests: the governor's budgets in box watts (power/rungs.py, power/governor.py and
their use in power/control.py). The floor is drawn whatever runs, so a budget of box watts
with floor F picks what a budget of dynamic watts (budget - F) picked before."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from power import control
from power import energy as energy_mod
from power.governor import GovernorConfig, GovernorState, Trend, step
from power.rungs import Rung, budget_levels, select_for_budget
from power.sensors import Reading
from runtime.device.profiles import load_profile

RUNGS = [Rung("small", 0.80, 0.010, 0.005), Rung("mid", 0.90, 0.030, 0.010),
         Rung("big", 0.98, 0.100, 0.020)]
FLOOR = 3.0
RPI = load_profile("rpi5")


def test_budget_levels_are_the_floor_plus_the_dynamic_levels():
    dyn = budget_levels(RUNGS, 10.0, 0.5)
    box = budget_levels(RUNGS, 10.0, 0.5, floor_w=FLOOR)
    assert box[0] == math.inf
    assert box[1:] == pytest.approx([w + FLOOR for w in dyn[1:]])


SELECT = [
    # (box budget W, current, expected (rung, rate)) at 10 Hz, floor 3 W
    (math.inf, None, (2, 10.0)),
    (3.0 + 1.0, None, (2, 10.0)),  # big draws 1 W at 10 Hz: fits exactly
    (3.0 + 0.99, None, (1, 10.0)),
    (3.0 + 0.05, None, (0, 5.0)),  # the cheapest at the rate the headroom allows
    (3.0, None, (0, 0.0)),  # no headroom above the floor: nothing runs (minimum duty)
    (1.0, None, (0, 0.0)),  # a budget under the floor: the same, never a negative rate
    # an upgrade needs 10 % headroom on the dynamic power, not on the box's (the floor is
    # drawn whatever runs): 3 + 1.0 x 1.1 = 4.1 W needed
    (4.05, 1, (1, 10.0)),
    (4.125, 1, (2, 10.0)),
]


@pytest.mark.parametrize("budget,current,want", SELECT)
def test_select_for_budget_in_box_watts(budget, current, want):
    got = select_for_budget(RUNGS, budget, 10.0, current, floor_w=FLOOR)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1])
    # the same pick as the dynamic budget above the floor with no floor
    dyn = select_for_budget(RUNGS, max(budget - FLOOR, 0.0), 10.0, current)
    assert dyn[0] == got[0] and dyn[1] == pytest.approx(got[1])


def test_the_stages_around_inference_count_in_a_rungs_power():
    """A rung whose model is cheap but whose frames cost more to decode and preprocess (a
    larger input) draws more: with other_j it no longer fits a budget its model alone did."""
    cheap_model = Rung("cheap", 0.9, 0.010, 0.005, other_j=0.050)
    assert cheap_model.power_w(10.0) == pytest.approx(0.6)
    assert cheap_model.box_w(10.0, FLOOR) == pytest.approx(3.6)
    assert select_for_budget([cheap_model], 3.5, 10.0, floor_w=FLOOR) == \
        (0, pytest.approx(0.5 / 0.060))


def ipa(floor: float) -> GovernorConfig:
    return GovernorConfig(control_c=78.0, critical_c=90.0, sustainable_w=floor + 2.0,
                          max_w=floor + 4.0, levels_w=(math.inf,), policy="power_allocator",
                          floor_w=floor)


@pytest.mark.parametrize("temps", [
    [60.0, 70.0, 75.0, 77.0, 79.0, 80.0, 78.0, 76.0],  # up through the trip and back
    [88.0, 85.0],  # within the critical margin: the floor, nothing more
    [50.0, 65.0, 69.0, 72.0],
])
def test_power_allocator_budget_is_the_floor_plus_the_dynamic_budget(temps):
    s0 = s1 = GovernorState()
    for i, t in enumerate(temps):
        tr = Trend(float(i), t, slope=0.05)
        s0, d0 = step(s0, tr, ipa(0.0))
        s1, d1 = step(s1, tr, ipa(FLOOR))
        if math.isinf(d0.budget_w):
            assert math.isinf(d1.budget_w)
        else:
            assert d1.budget_w == pytest.approx(d0.budget_w + FLOOR)
        assert d1.level == d0.level


def _outputs(c: control.ControlConfig, temps: list[float], battery: bool = False):
    s, cur, out = control.ControlState(), 2, []
    for i, t in enumerate(temps):
        r = Reading(float(i), temp_c=t, battery_frac=0.3 if battery else None)
        s, o = control.step(s, r, RUNGS, c, cur)
        cur = o.rung
        out.append(o)
    return out


@pytest.mark.parametrize("policy", ["step_wise", "power_allocator"])
def test_control_budgets_in_box_watts_pick_what_dynamic_budgets_picked(policy):
    """governor_config's floor is the profile's idle power; with the floor taken back out
    (floor 0, the sustainable power less the floor) every tick picks the same rung and rate:
    only the unit of the budget changed."""
    temps = [60.0 + 0.5 * i for i in range(50)] + [80.0 - 0.3 * i for i in range(40)]
    g = control.governor_config(RPI, policy)
    assert g.floor_w == RPI.power.idle_w and g.sustainable_w > g.floor_w
    box = control.ControlConfig(governor=g, rate_hz=10.0, min_rate_hz=0.5,
                                r_total_k_per_w=8.0)
    dyn = replace(box, governor=replace(g, floor_w=0.0,
                                        sustainable_w=g.sustainable_w - g.floor_w))
    a, b = _outputs(box, temps), _outputs(dyn, temps)
    assert [(o.rung, o.level) for o in a] == [(o.rung, o.level) for o in b]
    for x, y in zip(a, b, strict=True):
        assert x.rate_cap_hz == pytest.approx(y.rate_cap_hz)  # inf == inf too
        assert (math.isinf(x.budget_w) and math.isinf(y.budget_w)) or \
            x.budget_w == pytest.approx(y.budget_w + g.floor_w)
    assert any(math.isfinite(o.budget_w) for o in a), "the sequence must reach a budget"


def test_an_energy_budget_joins_the_thermal_one_in_box_watts():
    """power/energy.py plans dynamic power; the control step adds the floor before the
    stricter budget wins, so the two are compared in one unit."""
    e = energy_mod.EnergyConfig(capacity_wh=10.0, idle_w=1.0, max_w=math.inf)
    c = control.ControlConfig(governor=None, energy=e, rate_hz=10.0, min_rate_hz=0.5,
                              floor_w=FLOOR)
    outs = _outputs(c, [50.0] * 5, battery=True)
    assert any(math.isfinite(o.budget_w) for o in outs), "the battery must set a budget"
    plain = _outputs(replace(c, floor_w=0.0), [50.0] * 5, battery=True)
    for x, y in zip(outs, plain, strict=True):
        assert x.rung == y.rung and x.rate_cap_hz == pytest.approx(y.rate_cap_hz)
        assert (math.isinf(x.budget_w) and math.isinf(y.budget_w)) or \
            x.budget_w == pytest.approx(y.budget_w + FLOOR)


def test_the_stages_around_inference_join_every_rung_once_measured():
    from power.box_energy import BoxEnergy
    from power.rungs import with_other

    be = BoxEnergy(None, idle_w=FLOOR, w_per_cpu_s=5.0, on_event=lambda *a: None)
    assert be.around_j() is None  # no frames yet: not measured, the rungs as they are
    assert with_other(RUNGS, be.around_j()) == RUNGS
    # 10 frames in 1 s: 0.02 CPU s of decode and 0.01 of persist (5 W per CPU s) beside the
    # 0.05 s of inference: 15 mJ a frame around it
    be.tick(1.0, 10, {"capture": 0.0, "decode": 0.02, "crop": 0.0, "preprocess": 0.0,
                      "infer": 0.05, "postprocess": 0.0, "persist": 0.01, "publish": None})
    assert be.around_j() == pytest.approx(0.015)
    got = with_other(RUNGS, be.around_j())
    assert [r.other_j for r in got] == [pytest.approx(0.015)] * 3
    assert got[0].power_w(10.0) == pytest.approx((0.010 + 0.015) * 10)
