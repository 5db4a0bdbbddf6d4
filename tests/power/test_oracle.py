"""The hindsight oracle's comparisons on a device small enough to follow by hand
(power/oracle.py): what counts as a good inference, what the trip limits, which grid point the
schedule acts on, what runs when nothing fits. tests/power/test_governor_day.py judges the
policies against it over whole days.

The device: one node per interval (the oracle's relaxation), case -> ambient 10 K/W, die over
case 1 K/W, so over a 60 s interval at constant box power P from case c, ambient A:
c' = A + 10 P + (c - A - 10 P) e^(-60 / (10 C)), die = max(c, c') + P."""

from __future__ import annotations

import math

import pytest

from power.device import DeviceProfile, PowerModel, Thermal, ThermalModel, TripPoint
from power.oracle import OracleResult, Resolution, best_schedule
from power.rungs import Rung

PASSIVE_C = 60.0


def device(idle_w: float, c_case: float = 100.0) -> DeviceProfile:
    """The hand-sized device: passive trip 60 °C, critical 90 °C."""
    trips = (TripPoint(PASSIVE_C, "passive"), TripPoint(75.0, "hot"), TripPoint(90.0, "critical"))
    return DeviceProfile("hand", "", PowerModel(idle_w=idle_w, active_w_per_core=1.0),
                         thermal=Thermal(trips, ThermalModel(1.0, 5.0, 10.0, c_case)))


def die_c(case: float, ambient: float, p_w: float, c_case: float = 100.0) -> float:
    """The oracle's die at the end of one 60 s interval at box power `p_w` (module doc)."""
    c1 = ambient + 10 * p_w + (case - ambient - 10 * p_w) * math.exp(-60 / (10 * c_case))
    return max(case, c1) + p_w


ONE = Resolution(60.0, 0.05, 4)  # one action per quarter of the offered rate


def one_interval(dev: DeviceProfile, rungs: list[Rung], rate_hz: float, target_s: float,
                 ambient: float = 30.0, res: Resolution = ONE) -> OracleResult:
    return best_schedule(dev, rungs, lambda t: ambient, 0.0, 60.0, rate_hz, target_s, res=res)


def test_a_rung_exactly_at_the_latency_target_is_good():
    """Latency equal to the target counts, in the choice and in the tally."""
    got = one_interval(device(1.0), [Rung("r", 0.5, 0.01, 0.010)], 10.0, 0.010)
    assert (got.rungs, got.rates_hz) == ((0,), (10.0,))
    assert (got.good, got.good_weighted) == (600.0, 300.0)  # 10 Hz x 60 s, x accuracy 0.5


def test_a_rung_runs_no_faster_than_it_can():
    """Offered 200 Hz, a rung of 10 ms runs at most 100 Hz."""
    got = one_interval(device(1.0), [Rung("r", 0.5, 0.01, 0.010)], 200.0, 0.020)
    assert got.rates_hz == (100.0,) and got.good == 6000.0


def test_the_passive_trip_limits_with_the_idle_floor_counted():
    """15 W of inference settles under the trip alone (53.7 °C) but not over a 10 W idle
    floor (69.6 °C, under the critical trip): the oracle idles; its die is the floor's."""
    dev = device(10.0)
    assert die_c(30.0, 30.0, 15.0) < PASSIVE_C < die_c(30.0, 30.0, 25.0) < 90.0
    got = one_interval(dev, [Rung("r", 0.5, 0.15, 0.010)], 100.0, 0.020,
                       res=Resolution(60.0, 0.05, 1))  # full rate or none
    assert got.rates_hz == (0.0,) and got.good == 0.0
    assert got.max_die_c == pytest.approx(die_c(30.0, 30.0, 10.0))


def test_nothing_fits_the_schedule_is_bounded_and_idles():
    """Idle alone settles 0.22 °C over the trip: every interval counts as bounded (a margin of
    a hair, not a degree) and the cheapest action runs."""
    dev = device(3.3)
    over = die_c(55.0, 55.0, 3.3)
    assert PASSIVE_C < over < PASSIVE_C + 1.0
    got = one_interval(dev, [Rung("r", 0.5, 0.01, 0.010)], 10.0, 0.020, ambient=55.0)
    assert got.rates_hz == (0.0,) and got.bounded_s == 60.0
    assert got.max_die_c == pytest.approx(over)


def test_an_ambient_at_the_trip_has_no_schedule():
    with pytest.raises(ValueError, match="reaches the 60 °C limit"):
        one_interval(device(1.0), [Rung("r", 0.5, 0.01, 0.010)], 10.0, 0.020, ambient=60.0)


FINE = Resolution(60.0, 0.05, 2000)  # 0.01 W a step: the best action rides the trip


@pytest.mark.parametrize(("name", "ambient", "c_case"), [
    # the grid point the schedule acts on is the one at or above the case: the one under it
    # allows a hair more (0.047 °C at 30 °C), over the trip at the case itself
    ("acting at the grid point at or above the case", lambda t: 30.0, 100.0),
    # the ambient falls: the case cools within the second interval, so the die's maximum is
    # at its start (the case then, plus the new power), not its end
    ("a cooling interval judged at its start", lambda t: 45.0 if t < 60.0 else 0.0, 10.0),
])
def test_the_schedule_never_crosses_the_trip(name, ambient, c_case):
    dev = device(0.5, c_case)
    got = best_schedule(dev, [Rung("r", 0.5, 0.1, 0.005)], ambient, 0.0, 120.0, 200.0, 0.020,
                        res=FINE)
    assert got.bounded_s == 0.0 and got.max_die_c <= PASSIVE_C
    assert got.max_die_c > PASSIVE_C - 0.05  # it rides the trip (else the case proves nothing)


def test_time_on_each_rung_counts_rate_zero_as_idle():
    got = OracleResult(0.0, 0.0, (0, 1, 1), (0.0, 5.0, 5.0), 50.0, 0.0)
    assert got.time_on(60.0) == {-1: 60.0, 1: 120.0}


def test_a_finer_resolution_halves_every_step():
    assert Resolution(60.0, 0.05, 32).finer() == Resolution(30.0, 0.025, 64)


def test_the_hottest_die_is_the_schedule_s_not_the_last_interval_s():
    """Full rate throughout (2.5 W settles under the trip): the die is hottest in the first
    interval at 45 °C ambient, and has cooled by the last, at 0 °C."""
    got = best_schedule(device(0.5, 10.0), [Rung("r", 0.5, 0.1, 0.005)],
                        lambda t: 45.0 if t < 60.0 else 0.0, 0.0, 180.0, 20.0, 0.020, res=ONE)
    assert got.rates_hz == (20.0, 20.0, 20.0)
    assert got.max_die_c == pytest.approx(die_c(45.0, 45.0, 2.5, 10.0))  # 58.8 °C
