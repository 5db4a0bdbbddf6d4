"""Table tests: step_wise's rate levels below the cheapest rung (power/rungs.py RATE_STEPS).

Where the cheapest rung at full rate draws a little more than the device sustains at its
trip, the governor can only cap the rate. With halvings alone (1/2, 1/4, 1/8) step_wise held
half the rate or less there: on a narrow ladder it delivered less than the cheapest rung run
unmanaged (issue 24, rpi5/hot 0.63x kernel-only against 1.11x). Steps of 2^-1/4 settle within
one step of what the device sustains."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from power.closed_loop import simulate
from power.plant import SCENARIOS, ambient
from power.rungs import RATE_STEPS, Rung, budget_levels, select_for_budget
from runtime.device.profiles import load_profile

RPI = load_profile("rpi5")  # passive 78 °C, 8 K/W die to ambient, 2.7 W idle


def test_the_levels_below_the_cheapest_rung_are_small_rate_steps_down_to_a_32nd():
    rungs = [Rung("small", 0.8, 0.010, 0.005), Rung("big", 0.98, 0.100, 0.020)]
    levels = budget_levels(rungs, 10.0, 0.5)
    assert levels[:2] == (math.inf, pytest.approx(0.1))  # unrestricted, then small at 10 Hz
    rates = [select_for_budget(rungs, w, 10.0)[1] for w in levels[2:]]
    # the steps above minimum duty (0.5 Hz), then minimum duty: none that changes nothing
    assert rates == pytest.approx([10.0 * k for k in RATE_STEPS if 10.0 * k > 0.5] + [0.5])
    assert len(rates) == len(set(rates))
    assert RATE_STEPS[-1] == pytest.approx(1 / 32)
    assert all(0.8 < b / a < 0.85 for a, b in zip((1.0, *RATE_STEPS[:-1]), RATE_STEPS, strict=True))


@pytest.mark.parametrize("min_rate_hz", [0.5, 10.0 * 2 ** -4, 10.0 * 2 ** -5])
def test_no_level_repeats_minimum_duty(min_rate_hz):
    """A rate step that lands on minimum duty is minimum duty: one level, not two (a level
    that changes nothing costs a settle_s on the way down and a dwell on the way up)."""
    rungs = [Rung("small", 0.8, 0.010, 0.005), Rung("big", 0.98, 0.100, 0.020)]
    levels = budget_levels(rungs, 10.0, min_rate_hz)
    assert all(b < a * (1 - 1e-9) for a, b in itertools.pairwise(levels))
    assert levels[-1] == pytest.approx(0.010 * min_rate_hz)


# (the cheapest rung's power at full rate / what rpi5 sustains at 78 °C in a 40 °C ambient,
#  steady-state share of the sustainable rate step_wise holds at least; halvings held
#  0.53, 0.60, 0.75, 0.63, 0.63)
SETTLE = [(1.05, 0.8), (1.2, 0.8), (1.5, 0.8), (2.5, 0.8), (5.0, 0.8)]


@pytest.mark.parametrize("over,share", SETTLE)
def test_step_wise_settles_near_the_sustainable_rate(over, share):
    sustainable_w = (78.0 - 40.0) / 8.0 - RPI.power.idle_w
    rung = Rung("only", 0.9, over * sustainable_w / 1000.0, 0.001, parallel=4)
    r = simulate(RPI, [rung], ambient(*SCENARIOS["hot"]), "step_wise", duration_s=3 * 3600,
                 rate_hz=1000.0, latency_target_s=0.02, record_every=10)
    late = [x for t, x in zip(r.trace["t"], r.trace["rate_hz"], strict=True) if t >= 5400]
    held = statistics.mean(late) / (sustainable_w / rung.energy_j)
    assert share <= held <= 1.0 and r.critical_trips == 0 and r.throttled_min == 0
